# Sourced by the scripts here on the GPU machine, from the repo root: the
# staged wheels (/tmp/site), FlashInfer where its chunks were received
# (/tmp/flashinfer-site), this tree first on PYTHONPATH, the extra wheels
# (.dev/extra/install.sh puts plotly, its narwhals and tqdm in /tmp/extra:
# the dashboard needs plotly) last, FlashInfer's JIT cache under /tmp, and
# $out ($OUT, default /tmp/out) created.
#
# It also byte-compiles the staged wheels (once) and this tree: they arrive
# without .pyc files and the machine keeps none of its own, so every Python
# process compiled what it imported (a pool run's driver on the H200 spent
# 1.5 of its 4.4 s compiling: docs/results/warm_nightly_h200_2026-12-02.md),
# where an installed cluster's packages come compiled.
source /tmp/site/env.sh
[[ -f /tmp/flashinfer-site/env.sh ]] && source /tmp/flashinfer-site/env.sh
export PYTHONPATH=.:${PYTHONPATH:-}${PYTHONPATH:+:}/tmp/extra
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer}
for tree in /tmp/site /tmp/extra /tmp/flashinfer-site; do
  if [[ -d $tree && ! -f $tree/.compiled ]]; then  # a file that does not compile stays source
    python3 -m compileall -q -j 0 "$tree" > /dev/null 2>&1; touch "$tree/.compiled"
  fi
done
python3 -m compileall -q -j 0 cluster jobs kernels dashboards benchmarks tests scripts > /dev/null 2>&1
out=${OUT:-/tmp/out}
mkdir -p "$out"
