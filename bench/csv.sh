# shellcheck shell=bash
# csv.sh: sourced by every script that reads or writes the CSVs under bench/data/ (the benchmark
# scripts in bench/, the charts and tables in plots/). Not run on its own.
#
#   csv_awk [-v name=value]... [-f library.awk]... 'program' [file...]
#       awk over comma-separated files with bench/csv.awk in front of the program: each file's
#       header is read into col[], and the program names its columns, get("tflops"), never $12.
#       -f puts another awk library (functions only) after csv.awk, such as plots/grid.awk.
#   csv_header_of FILE
#       a CSV's header line (empty if the file is missing or empty)
#   csv_append FILE HEADER
#       stdin's rows appended to FILE, which is started with HEADER if it does not exist yet; if
#       it does, its header must be HEADER (the columns a stage's --csv prints today), or nothing
#       is written and it fails, naming both headers.
#   csv_keep_rows WHO PATTERN HEADER ROWS
#       the rows in file ROWS (a run's, without their header HEADER) appended to the CSV whose path
#       is PATTERN with %s replaced by their gpu column (csv_append's header check), one line on
#       stderr saying how many (WHO: the script's name), and ROWS emptied: called at a run's end
#       and from its trap when it is stopped early, so a cut run keeps every row it finished.
#   csv_stage_lists
#       sets CPU_BINS, GPU_BINS and FWD_BINS (the GPU stages whose rows are forward: all but the
#       backward's) to the Makefile's lists ("stage4 stage5 ..."), the stages the CSVs should have
#       rows of: as make passes them in the environment (make plots), else asked of make; exported.
#       GPU_BINS is the Makefile's GRID_BINS: the GPU stages of the benchmark grid, without the
#       decode stages (make bench-decode, bench/data/<gpu>_decode.csv).

CSV_AWK_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/csv.awk

csv_awk() {
  local opts=() libs
  libs=$(cat "$CSV_AWK_LIB")
  while [ $# -gt 0 ]; do
    case $1 in
      -v) opts+=(-v "$2"); shift 2 ;;
      -f) libs+=$'\n'$(cat "$2"); shift 2 ;;
      *) break ;;
    esac
  done
  local prog=$1
  shift
  awk -F, "${opts[@]}" "$libs"$'\n'"$prog" "$@"
}

csv_header_of() { if [ -s "$1" ]; then head -n1 "$1"; fi; }

csv_append() {
  local file=$1 header=$2 have rows
  rows=$(cat)
  [ -n "$rows" ] || return 0
  have=$(csv_header_of "$file")
  if [ -z "$have" ]; then
    mkdir -p "$(dirname "$file")"
    printf '%s\n' "$header" > "$file"
  elif [ "$have" != "$header" ]; then
    { echo "$file's header is not the columns these rows have: nothing appended."
      echo "  file:  $have"
      echo "  rows:  $header"
      echo "  (the columns changed in common/report.c: start a new file, or add the new columns to this one's rows)"; } >&2
    return 1
  fi
  printf '%s\n' "$rows" >> "$file"
}

csv_keep_rows() {
  local who=$1 pattern=$2 header=$3 rows=$4 gpu file
  [ -n "$header" ] && [ -s "$rows" ] || return 0
  gpu=$( { echo "$header"; head -n1 "$rows"; } | csv_awk '{ print get("gpu") }')
  # shellcheck disable=SC2059 # the pattern is the caller's path with %s for the GPU
  file=$(printf "$pattern" "$gpu")
  csv_append "$file" "$header" < "$rows" && echo "$who: $(wc -l < "$rows") rows appended to $file" >&2
  : > "$rows"
}

csv_stage_lists() {
  if [ -z "${CPU_BINS+set}" ] || [ -z "${GPU_BINS+set}" ] || [ -z "${FWD_BINS+set}" ]; then
    local root bins
    root=$(dirname "$(dirname "$CSV_AWK_LIB")")
    bins=$(make -s --no-print-directory -C "$root" \
             --eval 'csv-stage-lists: ; @echo "$(CPU_BINS)/$(GRID_BINS)/$(FWD_BINS)"' csv-stage-lists)
    IFS=/ read -r CPU_BINS GPU_BINS FWD_BINS <<< "$bins"
  fi
  export CPU_BINS GPU_BINS FWD_BINS
}
