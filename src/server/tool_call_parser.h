// The qwen3_coder tool-call parser (vLLM's `--tool-call-parser qwen3_coder`): Qwen3.5 writes a call
// as
//   <tool_call>
//   <function=NAME>
//   <parameter=ARG>
//   VALUE
//   </parameter>
//   </function>
//   </tool_call>
// This splits a reply's content into the text before the first <tool_call> (streamed as it comes;
// a tag cut across deltas is held back) and the calls after it, streamed as OpenAI tool-call
// deltas as their parts complete: the name once `<function=NAME>` is whole, then the JSON
// arguments a parameter at a time (`{"city":"Paris"`, `,"days":3`, then `}`), so the pieces of a
// call add up to its compact JSON object. Each VALUE becomes JSON by the type its tool's schema
// declares (integer, number, boolean, object, array, else string); a repeated parameter keeps its
// first value. As in vLLM's parser, a call or parameter left open (cut by max_tokens, say) is read
// to the end of the reply; a call whose function name is empty or never completed is no call.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_body.h"

namespace deltaserve::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialised
};

// A piece of the index-th call: its first piece carries the name.
struct ToolCallDelta {
  int32_t index = 0;
  std::string name;
  std::string arguments;
};

class ToolCallParser {
 public:
  // `tools`: the request's tools (null when none).
  explicit ToolCallParser(json tools) : tools_(std::move(tools)) {}
  const json& tools() const { return tools_; }

  // Content that can be streamed now (text before the first <tool_call>).
  std::string push(std::string_view text);
  // The call pieces completed since the last take().
  std::vector<ToolCallDelta> take();
  // At the end of the reply: content still held back; the last pieces go to take(), and every
  // call of the reply to `calls`.
  std::string finish(std::vector<ToolCall>& calls);

 private:
  json typed_value(const std::string& function, const std::string& arg, std::string value) const;
  // Emits the pieces that calls_ completes from pos_ on; `final`: the reply has ended.
  void scan(bool final);
  // One step of scan inside a call whose name is out; false when it must wait for more text.
  bool scan_arguments(bool final);
  void emit(std::string name, std::string arguments);

  json tools_;
  std::string held_;   // a possible start of <tool_call>
  std::string calls_;  // everything from the first <tool_call> on
  bool in_calls_ = false;
  // Scan state over calls_: the position, whether a call is open and its name out, its name, the
  // parameters already in its arguments.
  size_t pos_ = 0;
  bool in_call_ = false, named_ = false;
  std::string function_;
  std::vector<std::string> keys_;
  int32_t num_calls_ = 0;
  std::vector<ToolCallDelta> pieces_;  // every piece so far
  size_t taken_ = 0;
};

}  // namespace deltaserve::server
