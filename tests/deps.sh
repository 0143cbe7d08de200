#!/usr/bin/env bash
# tests/deps.sh: what the tests (and the charts) need beyond a C compiler, installed where this
# machine lets us, or the one line to run where it does not.
#   tests/deps.sh test   Criterion and pkg-config: what `make test` needs (make runs this first)
#   tests/deps.sh plots  gnuplot: what `make plots` needs (make runs this first)
#   tests/deps.sh all    all of those: what `make deps` installs
# Installs with apt-get as root or through sudo without a password, saying what it runs;
# otherwise exits 2 with the commands for Debian/Ubuntu, Fedora and macOS (Homebrew).
set -euo pipefail
what=${1:-all}
case "$what" in test | plots | all) ;; *) echo "usage: tests/deps.sh [test|plots|all]" >&2; exit 2 ;; esac

have_criterion() { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists criterion; }
have_gnuplot() { command -v gnuplot >/dev/null 2>&1; }

want_missing() {   # fills missing with the Debian package names not installed yet
    missing=()
    [ "$what" = plots ] || have_criterion || missing+=(libcriterion-dev pkg-config)
    [ "$what" = test ] || have_gnuplot || missing+=(gnuplot-nox)
}
want_missing
((${#missing[@]} == 0)) && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; else sudo="none"; fi
fi
if command -v apt-get >/dev/null 2>&1 && [ "$sudo" != none ]; then
    # one apt-get at a time (make -j may ask for the tests' and the charts' at once): wait for the
    # other, then install only what it left missing
    if command -v flock >/dev/null 2>&1 && { exec 9>>"${TMPDIR:-/tmp}/attn-deps.lock"; } 2>/dev/null; then
        flock 9
        want_missing
        ((${#missing[@]} == 0)) && exit 0
    fi
    echo "deps: installing ${missing[*]}: ${sudo:+$sudo }apt-get install -y --no-install-recommends ${missing[*]}" >&2
    ${sudo:+$sudo} env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    ${sudo:+$sudo} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    exit 0
fi

debian="" fedora="" brew=""
if [ "$what" != plots ]; then debian+=" libcriterion-dev pkg-config" fedora+=" criterion-devel pkgconf-pkg-config" brew+=" criterion pkg-config"; fi
if [ "$what" != test ]; then debian+=" gnuplot-nox" fedora+=" gnuplot-minimal" brew+=" gnuplot"; fi
debian=${debian# } fedora=${fedora# } brew=${brew# }
printf '%s\n' "deps: missing ${missing[*]} and no apt-get this user may run; install them yourself, then make again:" \
    "  Debian/Ubuntu:  sudo apt-get install $debian" \
    "  Fedora:         sudo dnf install $fedora" \
    "  macOS:          brew install $brew" >&2
exit 2
