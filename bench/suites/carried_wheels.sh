#!/usr/bin/env bash
# Build .whl/ here, before a device call: the GPU machine's python (3.12, torch preinstalled) lacks
# pyelftools, zstandard and platformdirs, and cannot reach the network. bench/lib/suite_lib.sh installs them there.
#   bash bench/suites/carried_wheels.sh      # then: run(..., carry=[".whl"], command="bash bench/suites/<suite>.sh")
# .whl/ is git-ignored (a new checkout has none: run this again).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${CARRIED_PYTHON_VERSION:-3.12}
PLATFORM=${CARRIED_PLATFORM:-manylinux2014_x86_64}
rm -rf .whl.partial && mkdir -p .whl.partial/test
download() {
    python3 -m pip download -q --only-binary=:all: --no-deps --python-version "$PY" --platform "$PLATFORM" \
        --platform manylinux_2_17_x86_64 --platform any --dest "$@"
}
download .whl.partial pyelftools zstandard platformdirs
download .whl.partial/test pytest pluggy iniconfig packaging
rm -rf .whl && mv .whl.partial .whl  # whole or not at all
ls .whl .whl/test
