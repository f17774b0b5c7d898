#!/usr/bin/env bash
# A first `check` as on a freshly started machine: the page cache dropped (root only: `echo 3 >
# /proc/sys/vm/drop_caches`) and a fresh home, then a first run with a fresh home and the page cache warm; this
# checkout against BEFORE (another checkout's packages), alternated ROUNDS times. Prints one line a run and writes
# JSON lines to OUT (default bench/results/check_cold.jsonl).
#   bash bench/check/check_cold.sh BEFORE [PYTHON_TO_AUDIT] [ROUNDS]
#   e.g. bash bench/check/check_cold.sh .tmp/before-prefill /tmp/v13/bin/python 3
set -eu
cd "$(dirname "$0")/../.."
here=$PWD
before=$(cd "${1:?usage: check_cold.sh BEFORE [PYTHON] [ROUNDS]}" && pwd)
python_args=()
[ -n "${2:-}" ] && python_args=(--python "$2")
rounds=${3:-3}
out=${OUT:-bench/results/check_cold.jsonl}
runner=${RUNNER:-$here/.venv/bin/python}
: >"$out"
one() {  # repo, home: seconds of one `check`
    local start end
    start=$(date +%s.%N)
    (cd "$1" && DFLASH_DOCTOR_HOME=$2 PYTHONPATH=$1 "$runner" -m dflash_doctor check --no-lock "${python_args[@]}" \
        --json >/dev/null)
    end=$(date +%s.%N)
    python3 -c "print(round($end - $start, 3))"
}
for round in $(seq "$rounds"); do
    for arm in before after; do
        repo=$here
        [ "$arm" = before ] && repo=$before
        home=$(mktemp -d)
        sync && echo 3 >/proc/sys/vm/drop_caches
        cold=$(one "$repo" "$home")
        home2=$(mktemp -d)
        first=$(one "$repo" "$home2")
        rm -rf "$home" "$home2"
        echo "$arm round $round: first, page cache dropped ${cold} s; first, page cache warm ${first} s"
        echo "{\"arm\": \"$arm\", \"round\": $round, \"cold_first_s\": $cold, \"first_s\": $first}" >>"$out"
    done
done
echo "wrote $out"
