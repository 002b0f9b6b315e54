#!/usr/bin/env bash
# Get the CIFAR-100 binary version into a data folder, verified.
#
#   scripts/get-cifar100.sh                      # -> data/cifar-100-binary/
#   scripts/get-cifar100.sh --from ~/Downloads/cifar-100-binary.tar.gz
#   scripts/get-cifar100.sh --from DIR           # a folder with the archive, cifar-100-binary/ or its files
#   scripts/get-cifar100.sh --from ~/data/cifar-100-python   # torchvision's download, converted
#
# Sources, first that applies: --from PATH; the shared copy beside the repo
# ($LTRAIN_SHARED_DATA/cifar-100, default ../shared/data/cifar-100); the official download.
#
# What is checked:
#   - the archive (cifar-100-binary.tar.gz) against its published size and SHA-256
#     (tensorflow_datasets' url checksums, which record both) and its MD5 (the Toronto download
#     page's), before it is unpacked;
#   - train.bin and test.bin against their sizes (50,000 and 10,000 records of 3074 bytes) and
#     their MD5s, and the two label-name files for being there. No checksum of the single files is
#     published by the data set's authors and none with SHA-256 anywhere we found: the MD5s are the
#     ones rai-project/dldataset lists for them (its list for CIFAR-10's files matches the official
#     files), so a folder given as extracted files is held to those.
# Files are unpacked or copied into a temp folder beside the destination, checked, and only then
# renamed into place: never a half-extracted folder under the final name.
#
# Exit codes: 0 ok, 2 usage, 3 data (missing, damaged, cannot download), 1 anything else.
set -euo pipefail

readonly URL="https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz"
readonly ARCHIVE="cifar-100-binary.tar.gz"
readonly ARCHIVE_BYTES=168513733
readonly ARCHIVE_SHA256="58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec"
readonly ARCHIVE_MD5="03b5dce01913d631647c71ecec9e9cb8"
readonly NAME="cifar-100-binary"
readonly PYTHON_NAME="cifar-100-python"  # torchvision's Python release, converted when given
# name, size in bytes, MD5 ("-": only there and not empty).
readonly FILES="\
train.bin 153700000 6172c7755cfe09b2fe270c85cebc1b15
test.bin 30740000 4499cfba6c016c1be1438163640a0898
coarse_label_names.txt - -
fine_label_names.txt - -"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED_DATA="${LTRAIN_SHARED_DATA:-$REPO_ROOT/../shared/data}"
# shellcheck disable=SC2034  # lib/fetch.sh's messages read it
FETCH_NAME=get-cifar100
# shellcheck source-path=SCRIPTDIR source=lib/fetch.sh
source "$REPO_ROOT/scripts/lib/fetch.sh"

usage() {
  cat <<EOF
Usage: scripts/get-cifar100.sh [--dest DIR] [--from PATH] [--help]

Puts CIFAR-100's binary files in DIR/$NAME (default DIR: data/), checked (see the
script's head for how). Does nothing if they are already there and intact.

  --dest DIR   data folder (default: $REPO_ROOT/data)
  --from PATH  local source: the official $ARCHIVE, or a directory holding it, a
               $NAME/ folder or the extracted files (train.bin, test.bin, ...), or
               torchvision's Python release ($PYTHON_NAME/), converted to the binary files
               (needs a Python with numpy 1 or 2) and checked as they are; one of other
               content is installed as it is, with a line that says so and SOURCE and
               SHA256SUMS files in the folder
  --help       this text

Without --from: uses \$LTRAIN_SHARED_DATA/cifar-100 (default $REPO_ROOT/../shared/data) if it
exists, else downloads $URL.
Exit codes: 0 ok, 2 usage, 3 data missing/damaged/not downloadable.
EOF
}

# folder_problems DIR: one line per file of FILES that is missing or not as published; returns 1 if any.
folder_problems() {
  local dir="$1" name bytes md5 bad=0
  while read -r name bytes md5; do
    if [[ ! -s "$dir/$name" ]]; then echo "$name is missing or empty"; bad=1
    elif [[ "$bytes" != - && "$(size_of "$dir/$name")" != "$bytes" ]]; then
      echo "$name has $(size_of "$dir/$name") bytes, not $bytes"; bad=1
    elif [[ "$md5" != - && "$(md5_of "$dir/$name")" != "$md5" ]]; then echo "$name is damaged (MD5 mismatch)"; bad=1
    fi
  done <<<"$FILES"
  return "$bad"
}

# archive_problem FILE: why FILE is not the published archive (nothing when it is); returns 1 then.
archive_problem() {
  local file="$1" bytes sha md5
  bytes="$(size_of "$file")"
  if [[ "$bytes" != "$ARCHIVE_BYTES" ]]; then echo "$bytes bytes, the published archive has $ARCHIVE_BYTES"; return 1; fi
  sha="$(sha256_of "$file")"
  if [[ "$sha" != "$ARCHIVE_SHA256" ]]; then echo "SHA-256 $sha, published $ARCHIVE_SHA256"; return 1; fi
  md5="$(md5_of "$file")"
  if [[ "$md5" != "$ARCHIVE_MD5" ]]; then echo "MD5 $md5, published $ARCHIVE_MD5"; return 1; fi
}

# source_of PATH: what PATH stands for, as "archive FILE", "files DIR" or "python DIR".
source_of() {
  local path="$1"
  if [[ -f "$path" ]]; then echo "archive $path"
  elif [[ -f "$path/train.bin" ]]; then echo "files $path"
  elif [[ -f "$path/$NAME/train.bin" ]]; then echo "files $path/$NAME"
  elif [[ -f "$path/$ARCHIVE" ]]; then echo "archive $path/$ARCHIVE"
  elif [[ -f "$path/train" && -f "$path/test" && -f "$path/meta" ]]; then echo "python $path"
  elif [[ -f "$path/$PYTHON_NAME/train" ]]; then echo "python $path/$PYTHON_NAME"
  else die 3 "no CIFAR-100 files in $path (expected $ARCHIVE, $NAME/, $PYTHON_NAME/ or train.bin, test.bin, ...)"
  fi
}

main() {
  local dest="$REPO_ROOT/data" from=""
  while (( $# )); do
    case "$1" in
      --help|-h) usage; exit 0 ;;
      --dest) (( $# >= 2 )) || die 2 "--dest needs a directory"; dest="$2"; shift 2 ;;
      --dest=*) dest="${1#--dest=}"; shift ;;
      --from) (( $# >= 2 )) || die 2 "--from needs a path"; from="$2"; shift 2 ;;
      --from=*) from="${1#--from=}"; shift ;;
      *) die 2 "unknown argument '$1' (see --help)" ;;
    esac
  done
  [[ -z "$from" || -e "$from" ]] || die 3 "--from: no such file or directory: $from"
  mkdir -p "$dest"
  dest="$(cd "$dest" && pwd)"
  local final="$dest/$NAME" report
  if [[ -d "$final" ]]; then
    if report="$(folder_problems "$final")"; then
      info "$final already present, verified (sizes, MD5)"
      return 0
    fi
    local recorded
    if recorded="$(recorded_source "$final")"; then
      info "$final already present: $recorded; its files match its SHA256SUMS"
      return 0
    fi
    info "$final is incomplete or damaged ($(paste -sd, <<<"$report")); getting it again"
  fi
  if [[ -z "$from" && -d "$SHARED_DATA/cifar-100" ]]; then
    info "using the shared copy in $SHARED_DATA/cifar-100"
    from="$SHARED_DATA/cifar-100"
  fi

  TMP_DIR="$(mktemp -d "$dest/.$NAME.tmp.XXXXXX")"
  local stage="$TMP_DIR/unpacked" kind path why resolved
  mkdir "$stage"
  if [[ -n "$from" ]]; then
    resolved="$(source_of "$from")" || exit "$?"
    read -r kind path <<<"$resolved"
  else
    info "downloading $URL"
    kind=archive path="$TMP_DIR/$ARCHIVE"
    why="$(download "$URL" "$path")" \
      || die 3 "no CIFAR-100 source: no local copy and the download failed ($why). Put $ARCHIVE in" \
               "$SHARED_DATA/cifar-100/, or pass --from PATH/$ARCHIVE"
  fi

  local got="$stage"
  if [[ "$kind" == archive ]]; then
    why="$(archive_problem "$path")" || die 3 "$path is not the published $ARCHIVE ($why); fetch it again"
    info "unpacking $path (size, SHA-256 and MD5 as published)"
    gzip -dc "$path" 2>"$TMP_DIR/unpack.err" | tar -x --no-same-owner -C "$stage" -f - 2>>"$TMP_DIR/unpack.err" \
      || die 3 "unpacking $path failed ($(head -n1 "$TMP_DIR/unpack.err")); fetch it again"
    got="$stage/$NAME"
  elif [[ "$kind" == python ]]; then
    convert_python_release cifar100 "$path" "$stage"
  else
    info "copying the extracted files from $path"
    local name
    while read -r name _; do
      if [[ -f "$path/$name" ]]; then cp "$path/$name" "$stage/"; fi
    done <<<"$FILES"
  fi
  if report="$(folder_problems "$got")"; then
    install_dir "$got" "$final"
    info "$final ready, verified (sizes, MD5)"
  elif [[ "$kind" == python ]]; then
    # A well-formed Python release of other content (a subset, a data set of CIFAR-100's form): ltrain
    # reads it, warning about a file of another number of records than the release's.
    info "$path is not the official CIFAR-100 (train.bin $(( $(size_of "$got/train.bin") / 3074 )) records," \
         "test.bin $(( $(size_of "$got/test.bin") / 3074 )); not the published files' MD5): installed as it is"
    local names
    mapfile -t names < <(awk '{print $1}' <<<"$FILES")
    record_source "$got" "converted from torchvision's Python release in $path, not the official CIFAR-100" "${names[@]}"
    install_dir "$got" "$final"
    info "$final ready (not the official files: SOURCE and SHA256SUMS in it say so)"
  else
    die 3 "$(head -n1 <<<"$report") in $path (all problems: $(paste -sd, <<<"$report")); fetch a good copy"
  fi
}

main "$@"
