# csv.awk: read the project's CSVs by column name, never by number. Every script that reads a
# CSV runs its awk program through csv_awk (bench/csv.sh), which puts this file in front of it.
#
# Each file's first line is its header: it sets col["name"] = column index and is skipped, so the
# program sees data rows only, and a file whose columns move or grow still reads the same. A row
# with another number of fields than its header stops the program (a value holding a comma, a
# row cut short); blank lines are skipped.
#   get("tflops")      the field of this row under that header name; a name the file does not
#                      have stops the program with an error naming the file and the column
#   has("machine")     whether this file has that column
# (Fields are split on commas: the CSVs hold no quoted fields, so no value may hold a comma.)

FNR == 1 { split("", col); for (i = 1; i <= NF; i++) col[$i] = i; csv_nf = NF; next }
NF == 0 { next }
NF != csv_nf {
    printf "%s, line %d: %d fields under a header of %d\n", FILENAME == "" ? "stdin" : FILENAME, FNR, NF, csv_nf > "/dev/stderr"
    csv_failed = 1
    exit 2
}

function get(name) {
    if (!(name in col)) {
        printf "%s: no column \"%s\" in its header\n", FILENAME == "" ? "stdin" : FILENAME, name > "/dev/stderr"
        csv_failed = 1
        exit 2
    }
    return $col[name]
}

function has(name) { return name in col }

# (this END runs before the program's own: after a failed get() it ends the run, exit status 2)
END { if (csv_failed) exit 2 }
