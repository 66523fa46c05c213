# The build directories shared by every clone on this machine (sourced by .ci/run and scripts/check).
#
# They live outside the clone, under $MESHCA_CI_CACHE (default ~/.cache/meshca-ci), keyed by the toolchain:
# another rustc starts from an empty directory, and the directories of other toolchains are deleted.
# Cargo decides what is fresh by itself: a dependency is reused only when its version, source, features,
# flags and profile all match. Exports CARGO_TARGET_DIR (the workspace) and MESHCA_FUZZ_TARGET_DIR (the
# instrumented fuzz workspace, scripts/fuzz).
use_build_cache() {
  local root=${MESHCA_CI_CACHE:-$HOME/.cache/meshca-ci}
  local key
  key=$(rustc -vV | sha256sum | cut -c1-16)
  mkdir -p "$root/$key/target" "$root/$key/fuzz"
  # Only the directories this function makes (a key's 16 hex digits) are ever deleted.
  find "$root" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' \
    -not -name "$key" -exec rm -rf {} +
  export CARGO_TARGET_DIR="$root/$key/target"
  export MESHCA_FUZZ_TARGET_DIR="$root/$key/fuzz"
  MESHCA_BUILD_CACHE="$root/$key"
}
