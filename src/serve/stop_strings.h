// Stop strings over streamed text: passes text through as it arrives, holding back only a tail that could
// still become the start of a stop string, and reports the first match (the text before it is the answer;
// the stop string itself is not part of it, as in OpenAI's API).
//
//   StopMatcher m({"\n\n", "END"});
//   std::string out = m.push("Hello EN");   // "Hello " ("EN" held back)
//   out += m.push("D more");                // "" and m.matched() == true
//   out += m.flush();                       // at the end of generation: whatever was held back
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace essaim::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // New text in; the part that is certainly answer out. After a match, returns "" forever.
  std::string push(std::string_view text);
  std::string flush();  // the held-back tail (nothing after a match)
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
};

}  // namespace essaim::serve
