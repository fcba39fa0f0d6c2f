// The decode attention's split count that fills whole waves (attention.cu's attention_splits,
// with DS_ATTN_WAVE_SPLITS on; a plain header: the launcher and a host-side test share it).
#pragma once

#include <cstdint>

namespace deltaserve::cuda {

// The most splits a step of `blocks` blocks a split takes: enough for ~2 waves of num_sms SMs, at
// most max_splits.
inline int two_wave_splits(int blocks, int num_sms, int max_splits) {
  const int splits = (2 * num_sms + blocks - 1) / blocks;
  return splits < 1 ? 1 : splits > max_splits ? max_splits : splits;
}

// Of 1..cap splits, the one whose blocks (`blocks` a split, one block an SM: the bf16 cache's
// shared memory) waste the least of their last wave: the fewest waves a split, the fewest splits
// among equals.
inline int wave_filling_splits(int blocks, int cap, int num_sms) {
  int best = 1;
  int64_t best_waves = (blocks + num_sms - 1) / num_sms;  // waves of `best` splits
  for (int splits = 2; splits <= cap; ++splits) {
    const int64_t waves = (static_cast<int64_t>(blocks) * splits + num_sms - 1) / num_sms;
    if (waves * best < best_waves * splits) {  // waves / splits < best_waves / best
      best = splits;
      best_waves = waves;
    }
  }
  return best;
}

}  // namespace deltaserve::cuda
