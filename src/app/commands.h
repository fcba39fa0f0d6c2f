// Subcommands of the deltaserve binary that live outside main.cpp.
#pragma once

#include <string>
#include <vector>

namespace deltaserve::app {

// `deltaserve bench offline ...`: requests through the engine, one JSON line of results.
int cmd_bench(const std::vector<std::string>& argv);

// `deltaserve bench serve ...`: a streaming load client against a running server.
int cmd_bench_serve(const std::vector<std::string>& argv);

// `deltaserve serve ...`: the OpenAI-compatible HTTP server.
int cmd_serve(const std::vector<std::string>& argv);

}  // namespace deltaserve::app
