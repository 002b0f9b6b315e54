# shellcheck shell=bash
# What the data scripts (get-cifar10.sh, get-cifar100.sh) share: messages and exit codes, checksums,
# the staging folder, the download, and the rename into place. Sourced, not run; the script sets
# FETCH_NAME (its name in messages) first.
#
# Exit codes: 0 ok, 2 usage, 3 data (missing, damaged, cannot download), 1 anything else.

TMP_DIR=""  # the staging folder beside the destination (mktemp -d "DEST/.NAME.tmp.XXXXXX"); removed on exit

die() { local code="$1"; shift; echo "$FETCH_NAME: $*" >&2; exit "$code"; }
info() { echo "$FETCH_NAME: $*"; }
remove_staging() { if [[ -n "$TMP_DIR" && -d "$TMP_DIR" ]]; then rm -rf "$TMP_DIR"; fi; }
trap remove_staging EXIT

sha256_of() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1
  else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

md5_of() {
  if command -v md5sum >/dev/null; then md5sum "$1" | cut -d' ' -f1
  else md5 -q "$1"; fi
}

size_of() { wc -c <"$1" | tr -d ' '; }

# install_dir STAGED FINAL: replace FINAL with the verified STAGED folder (same filesystem).
install_dir() {
  local staged="$1" final="$2" old=""
  if [[ -e "$final" ]]; then
    old="$final.old.$$"
    mv "$final" "$old"
  fi
  mv "$staged" "$final"
  if [[ -n "$old" ]]; then rm -rf "$old"; fi
}

# download URL FILE: fetch URL into FILE; fails fast without network. On failure prints the
# reason on stdout and returns 1.
download() {
  local url="$1" out="$2" err="$2.err"
  if command -v curl >/dev/null; then
    if ! curl -fsSL --connect-timeout 10 --max-time 900 -o "$out" "$url" 2>"$err"; then
      head -n1 "$err"; return 1
    fi
  elif command -v wget >/dev/null; then
    if ! wget -q --connect-timeout=10 --read-timeout=60 --tries=1 -O "$out" "$url" 2>"$err"; then
      echo "wget failed: $(head -n1 "$err")"; return 1
    fi
  else
    echo "neither curl nor wget is installed"; return 1
  fi
}

# convert_python_release RELEASE SOURCE_DIR OUT_DIR: torchvision's Python release (cifar10:
# cifar-10-batches-py, cifar100: cifar-100-python) as the binary one's files in OUT_DIR
# (lib/cifar_from_python.py, which reads pickles of numpy 1 and 2 alike), under the first Python with
# numpy: $LTRAIN_PYTHON, the project's environments ($LTRAIN_VENV, default .venv/, then .venv-plots/),
# /usr/bin/python3, python3.
convert_python_release() {
  local release="$1" source="$2" out="$3" python root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  for python in "${LTRAIN_PYTHON:-}" "${LTRAIN_VENV:-$root/.venv}/bin/python3" "$root/.venv-plots/bin/python3" \
                /usr/bin/python3 python3; do
    [[ -n "$python" ]] && "$python" -c "import numpy" >/dev/null 2>&1 && break
    python=""
  done
  [[ -n "$python" ]] \
    || die 3 "converting torchvision's Python release in $source needs numpy: bash scripts/python-env.sh --plots (or apt-get install python3-numpy), then this command again"
  info "converting torchvision's Python release in $source to the binary one"
  local err
  if ! err="$("$python" "$root/scripts/lib/cifar_from_python.py" "$release" "$source" "$out" 2>&1 >/dev/null)"; then
    die 3 "$source is not a well-formed Python release of ${release/cifar/CIFAR-} (${err#cifar_from_python: }); fetch it again"
  fi
}

# record_source DIR TEXT FILE...: DIR/SOURCE says where the files came from (TEXT) and DIR/SHA256SUMS
# holds their checksums: a folder that is not the official release, kept as it is by a later run
# (recorded_source).
record_source() {
  local dir="$1" text="$2"
  shift 2
  echo "$text" >"$dir/SOURCE"
  (cd "$dir" && sha256sum -- "$@" >SHA256SUMS)
}

# recorded_source DIR: SOURCE's text where DIR holds a record_source record that its files still
# match; fails otherwise.
recorded_source() {
  local dir="$1"
  [[ -f "$dir/SOURCE" && -f "$dir/SHA256SUMS" ]] || return 1
  (cd "$dir" && sha256sum -c --quiet SHA256SUMS >/dev/null 2>&1) || return 1
  cat "$dir/SOURCE"
}
