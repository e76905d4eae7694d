#!/usr/bin/env bash
# Writes the ghz call data the configs in this folder read (data/*.json), with attnserve-cli
# ghz-data: protobuf's own JSON mapping of real attnserve.v1.AttendRequest (and DecodeRequest) messages, input as
# base64 float32 bytes (`raw`), deterministic for the seed. The files are a few MB: generated,
# never committed (data/ is git-ignored).
#
#   bash deploy/ghz/make-data.sh                # model demo, d_model 512
#   MODEL=mine D_MODEL=256 bash deploy/ghz/make-data.sh
#
# Environment: ATTNSERVE_CLI (default: build/client/cli/attnserve-cli of this checkout), MODEL,
# D_MODEL, SEED, OUT_DIR (default: data/ next to this script).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cli="${ATTNSERVE_CLI:-${root}/build/client/cli/attnserve-cli}"
model="${MODEL:-demo}"
d_model="${D_MODEL:-512}"
seed="${SEED:-1}"
out_dir="${OUT_DIR:-${here}/data}"

if [[ ! -x "${cli}" ]]; then
  echo "make-data.sh: ${cli} not found; build it (cmake --build build --target attnserve-cli)" \
       "or set ATTNSERVE_CLI" >&2
  exit 1
fi
mkdir -p "${out_dir}"

# name  T  count: short.json and long.json are cycled through by unary calls (one object per
# call); stream.json's array is the messages of each AttendStream call.
while read -r name length count; do
  "${cli}" ghz-data --model "${model}" --shape "${length},${d_model}" --count "${count}" \
    --seed "${seed}" --raw --raw-output --out "${out_dir}/${name}"
  echo "wrote ${out_dir}/${name} (${count} x [${length}, ${d_model}])"
done <<LIST
short.json 16 64
long.json 512 4
stream.json 16 64
LIST

# decode.json: the 66 messages of each Decode stream (opens of 8 sessions with prompts of 128 rows,
# 64 messages of one one-row step per session, the closes).
"${cli}" ghz-data --model "${model}" --shape "128,${d_model}" --decode-sessions 8 \
  --decode-steps 64 --seed "${seed}" --raw --raw-output --out "${out_dir}/decode.json"
echo "wrote ${out_dir}/decode.json (Decode: 8 sessions x [128, ${d_model}] prompts, 64 steps)"

# infer.json: the same [16, d_model] inputs as Open Inference Protocol ModelInferRequests
# (inference.GRPCInferenceService/ModelInfer, raw_input_contents as base64 float32), from numpy.
/usr/bin/python3 - "${out_dir}/infer.json" "${model}" "${d_model}" "${seed}" <<'PY'
import base64, json, sys
import numpy as np
path, model, d_model, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
requests = []
for i in range(64):
    x = np.random.default_rng(seed + i).standard_normal((16, d_model)).astype("<f4")
    requests.append({"model_name": model,
                     "inputs": [{"name": "input", "datatype": "FP32",
                                 "shape": [str(n) for n in x.shape]}],
                     "raw_input_contents": [base64.b64encode(x.tobytes()).decode()]})
with open(path, "w") as out:
    json.dump(requests, out)
PY
echo "wrote ${out_dir}/infer.json (64 x [16, ${d_model}] ModelInfer)"
