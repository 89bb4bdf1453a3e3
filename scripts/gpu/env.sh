# Sourced by the scripts here on the GPU machine, from the repo root: the
# staged wheels (/tmp/site), FlashInfer where its chunks were received
# (/tmp/flashinfer-site), this tree first on PYTHONPATH, the extra wheels
# (.dev/extra/install.sh puts plotly, its narwhals and tqdm in /tmp/extra:
# the dashboard needs plotly) last, FlashInfer's JIT cache under /tmp, and
# $out ($OUT, default /tmp/out) created.
source /tmp/site/env.sh
[[ -f /tmp/flashinfer-site/env.sh ]] && source /tmp/flashinfer-site/env.sh
export PYTHONPATH=.:${PYTHONPATH:-}${PYTHONPATH:+:}/tmp/extra
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer}
out=${OUT:-/tmp/out}
mkdir -p "$out"
