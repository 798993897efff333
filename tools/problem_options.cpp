#include "tools/problem_options.hpp"

namespace flashjit::cli {

void ProblemOptions::add_to(CLI::App &app) {
  app.add_option("--batch,-b", batch, "sequences")->capture_default_str();
  app.add_option("--seqlen-q,-s", seqlen_q, "query tokens per sequence")->capture_default_str();
  app.add_option("--seqlen-k", seqlen_k, "key tokens per sequence (default: seqlen-q)");
  app.add_option("--heads-q", heads_q, "query heads")->capture_default_str();
  app.add_option("--heads-kv", heads_kv, "key/value heads (GQA/MQA; default: heads-q)");
  app.add_option("--head-dim,-d", head_dim, "head dim of Q and K (multiple of 8, up to 256)")->capture_default_str();
  app.add_option("--head-dim-v", head_dim_v, "head dim of V and O (default: head-dim)");
  app.add_option("--dtype", dtype, "bf16 | fp16")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
  app.add_flag("--causal", causal, "causal mask, aligned bottom-right");
  app.add_option("--window", window, "sliding window LEFT,RIGHT (-1 = unbounded)")->delimiter(',')->expected(2);
  app.add_option("--softcap", softcap, "logit softcap (0 = off)");
  app.add_option("--scale", scale, "softmax scale (0 = 1/sqrt(head-dim))");
  app.add_option("--varlen-q", varlen_q, "varlen: query lengths per sequence, e.g. 1,300,77")->delimiter(',');
  app.add_option("--varlen-k", varlen_k, "varlen: key lengths per sequence (default: varlen-q)")->delimiter(',');
  app.add_option("--page-size", page_size, "paged KV with this page size (shuffled block table)");
  app.add_option("--row-padding", row_padding, "extra elements between tokens (non-contiguous strides)");
  app.add_flag("--head-major", head_major,
               "Q, K, V, O stored [batch, heads, tokens, dim] (PyTorch's layout); pages [pages, heads, page, dim]");
  app.add_option("--seed", seed, "random seed of the inputs")->capture_default_str();
  app.add_option("--variant", variant, "kernel family: auto | fa2 | fa3 | decode_splitk")
      ->check(CLI::IsMember({"auto", "fa2", "fa3", "decode_splitk"}))
      ->capture_default_str();
  app.add_flag("--strict", strict, "a fallback from the preferred kernel is an error");
}

Options ProblemOptions::runtime_options() const {
  Options options;
  options.strict = strict ? 1 : 0;
  if (variant == "fa2")
    options.variant = FLASHJIT_VARIANT_FA2;
  else if (variant == "fa3")
    options.variant = FLASHJIT_VARIANT_FA3;
  else if (variant == "decode_splitk")
    options.variant = FLASHJIT_VARIANT_DECODE_SPLITK;
  return options;
}

bool ProblemOptions::to_case(harness::CaseOptions *out, std::string *error) const {
  harness::CaseOptions c;
  ref::Problem &p = c.problem;
  const bool varlen = !varlen_q.empty();
  if (varlen) {
    p.seqlens_q = varlen_q;
    p.seqlens_k = varlen_k.empty() ? varlen_q : varlen_k;
    if (p.seqlens_k.size() != p.seqlens_q.size()) {
      *error = "--varlen-k must list as many lengths as --varlen-q";
      return false;
    }
    p.batch = static_cast<int>(p.seqlens_q.size());
  } else {
    p.batch = batch;
    p.seqlens_q.assign(batch, seqlen_q);
    p.seqlens_k.assign(batch, seqlen_k > 0 ? seqlen_k : seqlen_q);
  }
  p.heads_q = heads_q;
  p.heads_kv = heads_kv > 0 ? heads_kv : heads_q;
  p.head_dim_qk = head_dim;
  p.head_dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  p.causal = causal;
  if (window.size() == 2) {
    p.window_left = window[0];
    p.window_right = window[1];
  }
  p.softcap = softcap;
  p.scale = scale;
  c.dtype = dtype == "fp16" ? ref::Dtype::fp16 : ref::Dtype::bf16;
  c.varlen = varlen;
  c.page_size = page_size;
  c.row_padding = row_padding;
  if (head_major && (varlen || row_padding != 0)) {
    *error = "--head-major takes fixed-length sequences without --row-padding";
    return false;
  }
  c.head_major = head_major;
  c.seed = seed;
  // Every problem gets the workspace its kernel asks for, as an engine would give it: the planned
  // split-K decode's, the fa3 tail split's (fixed-length non-causal problems without a window or
  // pages, where the planner splits the last waves, or FLASHJIT_FA3_TUNING=tail_split=1), the counter
  // of fa3's drawn tiles (causal problems), none for the rest.
  c.with_workspace = !varlen;
  *out = c;
  return true;
}

} // namespace flashjit::cli
