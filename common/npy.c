/* npy.c: NumPy's .npy format, version 1.0/2.0, little-endian, C order: enough to hand Q, K, V
 * to and from NumPy or PyTorch (np.load / np.save). Reads float32 and float16, writes float32. */
#include "harness.h"
#include "half.h"
#include <stdlib.h>
#include <string.h>

#define NPY_MAGIC "\x93NUMPY"

/* Value of `key` in the header dict, e.g. 'descr': '<f4' -> pointer just past "'descr':". */
static const char *npy_field(const char *hdr, const char *key)
{
    const char *p = strstr(hdr, key);
    if (!p) return NULL;
    p = strchr(p + strlen(key), ':');
    return p ? p + 1 : NULL;
}

float *npy_read4(const char *path, int dims[4], char *why, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(why, n, "cannot open %s", path); return NULL; }
    unsigned char pre[10];
    char *hdr = NULL;
    float *out = NULL;
    void *raw = NULL;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, NPY_MAGIC, 6) != 0) {
        snprintf(why, n, "%s is not an .npy file", path);
        goto done;
    }
    size_t hlen;
    if (pre[6] == 1) {
        hlen = pre[8] | (size_t)pre[9] << 8;
    } else { /* version 2 and 3: a 4-byte header length */
        unsigned char ext[2];
        if (fread(ext, 1, 2, f) != 2) { snprintf(why, n, "%s: truncated header", path); goto done; }
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)ext[0] << 16 | (size_t)ext[1] << 24;
    }
    /* NumPy writes headers of a few hundred bytes: a length past 1 MiB is a corrupt file */
    if (hlen > (1 << 20)) { snprintf(why, n, "%s: malformed header (%zu bytes long)", path, hlen); goto done; }
    hdr = calloc(hlen + 1, 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) { snprintf(why, n, "%s: truncated header", path); goto done; }
    const char *descr = npy_field(hdr, "'descr'"), *order = npy_field(hdr, "'fortran_order'"),
               *shp = npy_field(hdr, "'shape'");
    if (!descr || !order || !shp) { snprintf(why, n, "%s: malformed header", path); goto done; }
    while (*descr == ' ') descr++;
    int is_f4 = !strncmp(descr, "'<f4'", 5), is_f2 = !strncmp(descr, "'<f2'", 5);
    if (!is_f4 && !is_f2) {
        int len = *descr == '\'' ? (int)strcspn(descr + 1, "'") + 2 : (int)strcspn(descr, ",}");
        snprintf(why, n, "%s: dtype %.*s is not supported; expected float32 '<f4' or float16 '<f2'", path,
                 len > 32 ? 32 : len, descr);
        goto done;
    }
    while (*order == ' ') order++;
    if (strncmp(order, "False", 5)) { snprintf(why, n, "%s: Fortran order is not supported", path); goto done; }
    while (*shp == ' ') shp++;
    int nd = 0;
    long v[8];
    const char *p = shp + 1;
    while (nd < 8) {
        char *end;
        while (*p == ' ') p++;
        if (*p == ')') break;
        v[nd] = strtol(p, &end, 10);
        if (end == p) break;
        nd++;
        p = end;
        while (*p == ' ' || *p == ',') p++;
    }
    if (nd != 4) { snprintf(why, n, "%s: expected a 4-D array [B, H, N, d], got %d dims", path, nd); goto done; }
    /* the elements the file holds after the header: the shape may ask for no more, checked
     * before anything is allocated (so that a corrupt shape can neither ask for terabytes nor
     * wrap the count around) */
    const size_t esz = is_f4 ? 4 : 2;
    const long data_at = ftell(f);
    size_t held = 0;
    if (data_at >= 0 && fseek(f, 0, SEEK_END) == 0) {
        const long end = ftell(f);
        held = end > data_at ? (size_t)(end - data_at) / esz : 0;
    }
    if (data_at < 0 || fseek(f, data_at, SEEK_SET) != 0) { snprintf(why, n, "%s: cannot seek in it", path); goto done; }
    for (int k = 0; k < 4; k++) {
        if (v[k] < 1 || v[k] > (1L << 30)) { snprintf(why, n, "%s: bad dimension %ld", path, v[k]); goto done; }
        dims[k] = (int)v[k];
    }
    size_t count = 1;
    for (int k = 0; k < 4; k++) {
        if ((size_t)v[k] > held / count) { snprintf(why, n, "%s: file shorter than its shape says", path); goto done; }
        count *= (size_t)v[k];
    }
    raw = malloc(count * esz);
    out = malloc(count * sizeof(float));
    if (!raw || !out || fread(raw, esz, count, f) != count) {
        if (!raw || !out)
            snprintf(why, n, "%s: out of host memory for its %zu elements", path, count);
        else
            snprintf(why, n, "%s: cannot read its data", path);
        free(out);
        out = NULL;
        goto done;
    }
    for (size_t k = 0; k < count; k++)
        out[k] = is_f4 ? ((float *)raw)[k] : f16_to_f32(((uint16_t *)raw)[k]);
done:
    free(raw);
    free(hdr);
    fclose(f);
    return out;
}

int npy_write_f32(const char *path, const float *x, const int *dims, int ndim)
{
    char hdr[256];
    int k = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        k += snprintf(hdr + k, sizeof hdr - k, "%d,%s", dims[i], i + 1 < ndim ? " " : "");
        count *= (size_t)dims[i];
    }
    k += snprintf(hdr + k, sizeof hdr - k, "), }");
    int total = 10 + k + 1; /* pad with spaces so the data starts on a 64-byte boundary */
    int pad = (64 - total % 64) % 64;
    memset(hdr + k, ' ', (size_t)pad);
    k += pad;
    hdr[k++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(k & 0xff), (unsigned char)(k >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)k, f) == (size_t)k &&
             fwrite(x, sizeof(float), count, f) == count;
    return fclose(f) != 0 || !ok;
}
