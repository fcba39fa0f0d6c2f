#include "engine/metrics.h"

namespace deltaserve::engine {

void Histogram::observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++count;
}

}  // namespace deltaserve::engine
