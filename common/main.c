/* main.c: the one main() of every stage binary. The Makefile compiles it once per stage with
 * -DSTAGE_DESC=stageN_desc; everything else lives in the harness. */
#include "harness.h"

#ifndef STAGE_DESC
#error "compile with -DSTAGE_DESC=stageN_desc"
#endif

extern const struct stage STAGE_DESC;

int main(int argc, char **argv) { return harness_main(&STAGE_DESC, argc, argv); }
