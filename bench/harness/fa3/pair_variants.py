#!/usr/bin/env python3
"""Writes two diagnostic copies of templates/ for the CTA-pair A/B (docs/perf-notes.md, "fa3: CTA
pairs - outcome"): tplB = pairs coupled by the empty barriers, but each CTA loads its whole K/V
block itself (no multicast); tplC = cluster launch and pair order only (own loads, own barriers).
Usage: pair_variants.py REPO_ROOT OUT_DIR  (then build_var.sh builds A = the templates, B, C)."""
import shutil
import sys

root, out = sys.argv[1], sys.argv[2]
MULTICAST = """    for (int panel = 0; panel < panels; ++panel) {
      if constexpr (C::kClusterM == 1)
        tma_load_4d(dst_rows + panel * C::kSmemPanelBytesKV, &map, full_bar, panel * col_step, row, t.kv_head,
                    t.batch_coord, keep_policy);
      else
        tma_load_4d_multicast(dst_rows + panel * C::kSmemPanelBytesKV, &map, full_bar, panel * col_step, row, t.kv_head,
                              t.batch_coord, kPairMask, keep_policy);
    }"""
OWN_LOADS = """    for (int panel = 0; panel < panels; ++panel)
      for (int half = 0; half < C::kClusterM; ++half)
        tma_load_4d(dst + half * C::kKVRowsPerCta * C::kSwizzleBytes + panel * C::kSmemPanelBytesKV, &map, full_bar,
                    panel * col_step, t.k_row0 + n * C::kBlockN + half * C::kKVRowsPerCta, t.kv_head, t.batch_coord,
                    keep_policy);"""
REMOTE_RELEASE = """    if constexpr (C::kClusterM > 1)
      if (tid == 0)
        mbarrier_arrive_cluster(mapa_shared(empty_bar, pair_rank<C>() ^ 1));"""


def patch(path, old, new):
    text = open(path).read()
    if old not in text:
        sys.exit(f"{path}: the templates changed; update pair_variants.py")
    open(path, "w").write(text.replace(old, new))


for variant in ("tplB", "tplC"):
    dst = f"{out}/{variant}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(f"{root}/templates", dst)
    patch(f"{dst}/kernels/fa3/producer.cuh", MULTICAST, OWN_LOADS)
patch(f"{out}/tplC/kernels/fa3/consumer.cuh", REMOTE_RELEASE, "")
patch(f"{out}/tplC/kernels/fa3_prefill.cuh", "C::kConsumerWarpgroups * C::kClusterM", "C::kConsumerWarpgroups")
