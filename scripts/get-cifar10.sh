#!/usr/bin/env bash
# Get the CIFAR-10 binary version into a data folder, verified file by file.
#
#   scripts/get-cifar10.sh                      # -> data/cifar-10-batches-bin/
#   scripts/get-cifar10.sh --from ~/Downloads/cifar-10-binary.tar.gz
#   scripts/get-cifar10.sh --from parts/cifar-10-binary.tar.xz.part*
#   scripts/get-cifar10.sh --from ~/data/cifar-10-batches-py   # torchvision's download, converted
#   scripts/get-cifar10.sh --mini               # -> data/cifar10-mini/
#
# Sources, first that applies: --from PATH...; the shared copy beside the repo
# ($LTRAIN_SHARED_DATA, default ../shared/data); the official download.
# Files are unpacked into a temp folder beside the destination, checked against the official
# SHA-256 sums and only then renamed into place: never a half-extracted folder under the final name.
#
# Exit codes: 0 ok, 2 usage, 3 data (missing, damaged, cannot download), 1 anything else.
set -euo pipefail

readonly URL="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
readonly URL_MD5="c32a1d4ab5d03f1284b67883e8d87530"
readonly FULL_NAME="cifar-10-batches-bin"
readonly PYTHON_NAME="cifar-10-batches-py"  # torchvision's Python release, converted when given
readonly MINI_NAME="cifar10-mini"
readonly RECORD_BYTES=3073 OFFICIAL_FILE_BYTES=30730000  # a label byte and 3072 image bytes; 10000 records
# SHA-256 of the official cifar-10-batches-bin files.
readonly FULL_SUMS="\
558e74b5e208382e186da55784b4bac2cd52e558448e1b5800990fdb28ed8033  batches.meta.txt
cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5  data_batch_1.bin
a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed  data_batch_2.bin
bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67  data_batch_3.bin
014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48  data_batch_4.bin
755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add  data_batch_5.bin
8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b  test_batch.bin"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED_DATA="${LTRAIN_SHARED_DATA:-$REPO_ROOT/../shared/data}"
if [[ -d "$SHARED_DATA" ]]; then SHARED_DATA="$(cd "$SHARED_DATA" && pwd)"; fi
SOURCES=()   # what resolve_dir_source found
# shellcheck disable=SC2034  # lib/fetch.sh's messages read it
FETCH_NAME=get-cifar10
# shellcheck source-path=SCRIPTDIR source=lib/fetch.sh
source "$REPO_ROOT/scripts/lib/fetch.sh"

usage() {
  cat <<EOF
Usage: scripts/get-cifar10.sh [--dest DIR] [--from PATH...] [--mini] [--help]

Puts the CIFAR-10 binary files in DIR/$FULL_NAME (default DIR: data/), checked against the
official SHA-256 sums. Does nothing if they are already there and intact.

  --dest DIR      data folder (default: $REPO_ROOT/data)
  --from PATH...  local source(s): the official .tar.gz, a .tar.xz, split parts
                  (cifar-10-binary.tar.xz.part0 part1 ...; joined in natural name order), or a
                  directory holding the extracted files, a cifar-10-batches-bin/ folder, an
                  archive or the parts, or torchvision's Python release ($PYTHON_NAME/, what
                  torchvision.datasets.CIFAR10(download=True) leaves), converted to the binary
                  files (needs a Python with numpy 1 or 2) and checked as they are; one of other
                  records than the official release's (a subset) is installed as it is, with a
                  line that says so and SOURCE and SHA256SUMS files in the folder
  --mini          copy the small subset ($MINI_NAME, from --from DIR or
                  \$LTRAIN_SHARED_DATA/$MINI_NAME) to DIR/$MINI_NAME, checked with its SHA256SUMS
  --help          this text

Without --from: uses \$LTRAIN_SHARED_DATA/cifar-10 (default $REPO_ROOT/../shared/data) if it
exists, else downloads $URL.
Exit codes: 0 ok, 2 usage, 3 data missing/damaged/not downloadable.
EOF
}

# check_sums DIR SUMS_TEXT -> prints "missing: f" / "damaged: f" lines; returns 1 if any.
check_sums() {
  local dir="$1" sums="$2" want name bad=0
  while read -r want name; do
    [[ -z "$name" ]] && continue
    if [[ ! -f "$dir/$name" ]]; then echo "missing: $name"; bad=1
    elif [[ "$(sha256_of "$dir/$name")" != "$want" ]]; then echo "damaged: $name"; bad=1
    fi
  done <<<"$sums"
  return "$bad"
}

# unpack_to STAGE SOURCE...: unpack the given archive or parts into STAGE. Returns non-zero if
# the decompressor or tar fails (a damaged archive); their messages go to STAGE/../unpack.err.
unpack_to() {
  local stage="$1"; shift
  local err="$stage/../unpack.err"
  local tar_x=(tar -x --no-same-owner -C "$stage")
  case "$1" in
    *.part[0-9]*)
      local parts p
      mapfile -t parts < <(printf '%s\n' "$@" | sort -V)
      for p in "${parts[@]}"; do
        [[ "$p" == *.part[0-9]* ]] || die 2 "--from: cannot mix parts with other sources: $p"
      done
      info "joining ${#parts[@]} parts: ${parts[*]}"
      case "${parts[0]}" in
        *.tar.gz.part*|*.tgz.part*) cat "${parts[@]}" | gzip -dc 2>"$err" | "${tar_x[@]}" -f - 2>>"$err" ;;
        *) cat "${parts[@]}" | xz -dc 2>"$err" | "${tar_x[@]}" -f - 2>>"$err" ;;
      esac ;;
    *.tar.gz|*.tgz|*.tar.xz|*.txz|*.tar)
      (( $# == 1 )) || die 2 "--from: give one archive (or the .partN files), not $# paths"
      info "unpacking $1"
      case "$1" in
        *.tar.xz|*.txz) xz -dc "$1" 2>"$err" | "${tar_x[@]}" -f - 2>>"$err" ;;
        *.tar) "${tar_x[@]}" -f "$1" 2>"$err" ;;
        *) gzip -dc "$1" 2>"$err" | "${tar_x[@]}" -f - 2>>"$err" ;;
      esac ;;
    *) die 2 "--from: do not know how to unpack '$1' (expected .tar.gz, .tar.xz, .partN or a directory)" ;;
  esac
}

# resolve_dir_source DIR: set SOURCES to what a directory stands for: itself when it holds the
# extracted files, else its cifar-10-batches-bin/, its .partN files, or its one archive.
resolve_dir_source() {
  local dir="$1" f
  local parts=() archives=()
  if [[ -f "$dir/data_batch_1.bin" ]]; then SOURCES=("$dir"); return; fi
  if [[ -f "$dir/$FULL_NAME/data_batch_1.bin" ]]; then SOURCES=("$dir/$FULL_NAME"); return; fi
  if [[ -f "$dir/data_batch_1" && -f "$dir/test_batch" ]]; then SOURCES=("python:$dir"); return; fi
  if [[ -f "$dir/$PYTHON_NAME/data_batch_1" ]]; then SOURCES=("python:$dir/$PYTHON_NAME"); return; fi
  for f in "$dir"/*.part[0-9]*; do [[ -f "$f" ]] && parts+=("$f"); done
  if (( ${#parts[@]} )); then SOURCES=("${parts[@]}"); return; fi
  for f in "$dir"/*.tar.gz "$dir"/*.tgz "$dir"/*.tar.xz; do [[ -f "$f" ]] && archives+=("$f"); done
  if (( ${#archives[@]} == 1 )); then SOURCES=("${archives[0]}"); return; fi
  if (( ${#archives[@]} > 1 )); then die 2 "--from $dir: several archives there, name one: ${archives[*]}"; fi
  die 3 "no CIFAR-10 files in $dir (expected data_batch_1.bin..., $FULL_NAME/, $PYTHON_NAME/, *.tar.gz, *.tar.xz or *.partN)"
}

offline_message() {
  die 3 "no CIFAR-10 source: no local copy and the download failed ($1). Put cifar-10-binary.tar.gz (or the cifar-10-binary.tar.xz.part* files) in $SHARED_DATA/cifar-10/, or pass --from PATH/cifar-10-binary.tar.gz"
}

# download_to FILE: fetch the official archive and check its MD5; fails fast without network.
# On failure prints the reason on stdout and returns 1.
download_to() {
  local out="$1"
  download "$URL" "$out" || return 1
  local md5
  md5="$(md5_of "$out")"
  if [[ "$md5" != "$URL_MD5" ]]; then
    echo "the downloaded archive is damaged: md5 $md5, expected $URL_MD5"; return 1
  fi
}

# first_problem REPORT: "data_batch_3.bin is damaged (SHA-256 mismatch)" from check_sums output.
first_problem() {
  local line kind
  line="$(head -n1 <<<"$1")"
  kind="${line%%:*}"
  if [[ "$kind" == damaged ]]; then echo "${line#*: } is damaged (SHA-256 mismatch)"
  else echo "${line#*: } is missing"; fi
}

get_full() {
  local dest="$1"; shift
  local final="$dest/$FULL_NAME" report
  if [[ -d "$final" ]]; then
    if report="$(check_sums "$final" "$FULL_SUMS")"; then
      info "$final already present, all 7 files verified (SHA-256)"
      return 0
    fi
    local source
    if source="$(recorded_source "$final")"; then
      info "$final already present: $source; its files match its SHA256SUMS"
      return 0
    fi
    info "$final is incomplete or damaged ($(paste -sd, <<<"$report")); getting it again"
  fi

  SOURCES=("$@")
  if (( ${#SOURCES[@]} == 0 )) && [[ -d "$SHARED_DATA/cifar-10" ]]; then
    info "using the shared copy in $SHARED_DATA/cifar-10"
    SOURCES=("$SHARED_DATA/cifar-10")
  fi
  if (( ${#SOURCES[@]} == 1 )) && [[ -d "${SOURCES[0]}" ]]; then
    resolve_dir_source "${SOURCES[0]}"
  fi

  TMP_DIR="$(mktemp -d "$dest/.$FULL_NAME.tmp.XXXXXX")"
  local stage="$TMP_DIR/unpacked"
  mkdir "$stage"
  if (( ${#SOURCES[@]} == 0 )); then
    local why
    info "downloading $URL"
    why="$(download_to "$TMP_DIR/cifar-10-binary.tar.gz")" || offline_message "$why"
    SOURCES=("$TMP_DIR/cifar-10-binary.tar.gz")
  fi

  local what="${SOURCES[*]}" name s converted=0
  if [[ "${SOURCES[0]}" == python:* ]]; then
    what="${SOURCES[0]#python:}"
    convert_python_release cifar10 "$what" "$stage"
    converted=1
  elif (( ${#SOURCES[@]} == 1 )) && [[ -d "${SOURCES[0]}" ]]; then
    info "copying the extracted files from ${SOURCES[0]}"
    while read -r _ name; do
      if [[ -f "${SOURCES[0]}/$name" ]]; then cp "${SOURCES[0]}/$name" "$stage/"; fi
    done <<<"$FULL_SUMS"
  else
    for s in "${SOURCES[@]}"; do
      [[ -f "$s" ]] || die 2 "--from: expected one directory or archive/part files, got: $what"
    done
    unpack_to "$stage" "${SOURCES[@]}" \
      || die 3 "the archive is damaged, unpacking failed ($(head -n1 "$TMP_DIR/unpack.err")): $what; fetch it again"
  fi

  # The archive holds cifar-10-batches-bin/ (torchvision's, cifar-10-batches-py/); a directory copy
  # lands flat in the stage.
  local got="$stage"
  if [[ -d "$stage/$FULL_NAME" ]]; then got="$stage/$FULL_NAME"; fi
  if [[ -d "$stage/$PYTHON_NAME" ]]; then
    convert_python_release cifar10 "$stage/$PYTHON_NAME" "$TMP_DIR/converted"
    got="$TMP_DIR/converted"
    converted=1
  fi
  if report="$(check_sums "$got" "$FULL_SUMS")"; then
    install_dir "$got" "$final"
    info "$final ready, all 7 files verified (SHA-256)"
  elif ((converted)) && [[ -z "$(official_size_problems "$got" "$report")" ]]; then
    # A well-formed Python release of other records than the official one (a subset, a data set of
    # CIFAR-10's form): ltrain reads it, warning about each file's number of records.
    info "$what is not the official CIFAR-10 ($(records_note "$got")): installed as it is"
    local names
    mapfile -t names < <(awk '{print $2}' <<<"$FULL_SUMS")
    record_source "$got" "converted from torchvision's Python release in $what, not the official CIFAR-10" "${names[@]}"
    install_dir "$got" "$final"
    info "$final ready (not the official files: SOURCE and SHA256SUMS in it say so)"
  else
    report="$(official_size_problems "$got" "$report")"
    die 3 "$(first_problem "$report") in $what (all problems: $(paste -sd, <<<"$report")); fetch a good copy"
  fi
}

# official_size_problems DIR REPORT: check_sums's REPORT less the files of DIR that differ from the
# official ones in size, which a converted release may: what stays is damaged at the official size,
# which ltrain refuses to read as well.
official_size_problems() {
  local dir="$1" report="$2" line name
  while read -r line; do
    [[ -z "$line" ]] && continue
    name="${line#*: }"
    if [[ "$line" == damaged:* && "$name" == *.bin && "$(size_of "$dir/$name")" != "$OFFICIAL_FILE_BYTES" ]]; then
      continue
    fi
    echo "$line"
  done <<<"$report"
}

# records_note DIR: "data_batch_1.bin: 20 records, ..., the official files 10000 each".
records_note() {
  local dir="$1" name note=""
  for name in data_batch_{1..5}.bin test_batch.bin; do
    note+="$name $(( $(size_of "$dir/$name") / RECORD_BYTES )) records, "
  done
  echo "${note}the official files 10000 each"
}

get_mini() {
  local dest="$1"; shift
  (( $# <= 1 )) || die 2 "--mini --from takes one directory, got $#"
  local src="${1:-$SHARED_DATA/$MINI_NAME}"
  local final="$dest/$MINI_NAME"
  if [[ -f "$final/SHA256SUMS" ]] && (cd "$final" && sha256sum -c --quiet SHA256SUMS >/dev/null 2>&1) \
     && { [[ ! -f "$src/SHA256SUMS" ]] || cmp -s "$src/SHA256SUMS" "$final/SHA256SUMS"; }; then
    info "$final already present, all files verified (SHA-256)"
    return 0
  fi
  [[ -d "$src" ]] || die 3 "no $MINI_NAME source: $src does not exist; pass --mini --from DIR (a folder with SHA256SUMS and data_batch_1..5.bin, test_batch.bin)"
  [[ -f "$src/SHA256SUMS" ]] || die 3 "$src has no SHA256SUMS file: cannot verify it"

  TMP_DIR="$(mktemp -d "$dest/.$MINI_NAME.tmp.XXXXXX")"
  local stage="$TMP_DIR/$MINI_NAME" name
  mkdir "$stage"
  cp "$src/SHA256SUMS" "$stage/"
  while read -r _ name; do
    [[ -z "$name" ]] && continue
    [[ -f "$src/$name" ]] || die 3 "$name is missing in $src"
    cp "$src/$name" "$stage/"
  done <"$src/SHA256SUMS"
  local report
  if ! report="$(check_sums "$stage" "$(cat "$src/SHA256SUMS")")"; then
    die 3 "$(first_problem "$report") in $src; fetch a good copy"
  fi
  install_dir "$stage" "$final"
  info "$final ready, all files verified (SHA-256)"
}

main() {
  local dest="$REPO_ROOT/data" mini=0 from=()
  while (( $# )); do
    case "$1" in
      --help|-h) usage; exit 0 ;;
      --dest) (( $# >= 2 )) || die 2 "--dest needs a directory"; dest="$2"; shift 2 ;;
      --dest=*) dest="${1#--dest=}"; shift ;;
      --mini) mini=1; shift ;;
      --from)
        shift
        while (( $# )) && [[ "$1" != --* ]]; do from+=("$1"); shift; done
        (( ${#from[@]} )) || die 2 "--from needs at least one path" ;;
      *) die 2 "unknown argument '$1' (see --help)" ;;
    esac
  done
  local p
  for p in "${from[@]}"; do [[ -e "$p" ]] || die 3 "--from: no such file or directory: $p"; done
  mkdir -p "$dest"
  dest="$(cd "$dest" && pwd)"
  if (( mini )); then get_mini "$dest" "${from[@]}"; else get_full "$dest" "${from[@]}"; fi
}

main "$@"
