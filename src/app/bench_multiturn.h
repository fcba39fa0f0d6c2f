// The multi-turn chat workload of `deltaserve bench serve` (--workload multi-turn).
#pragma once

#include "app/args.h"

namespace deltaserve::app {

// Flags: host, port, api-key, model, num-clients, turns, system-len, turn-len, output-len, vocab,
// seed. Prints one JSON line; 0 when every turn completed.
int run_multi_turn(const Args& a);

}  // namespace deltaserve::app
