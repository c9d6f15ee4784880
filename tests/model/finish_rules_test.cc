// The finish rules shared by the generator, the decode engine and the router (model/finish_rules.h).
#include "model/finish_rules.h"

#include <gtest/gtest.h>

namespace icecache::model {
namespace {

TEST(TokenStops, StopIdsEosLengthAndContextInThatOrder) {
  TokenStops t({7}, {2}, /*ignore_eos=*/false, /*max_tokens=*/4, /*max_position=*/10);
  EXPECT_TRUE(t.IsStop(7));
  EXPECT_TRUE(t.IsStop(2));
  EXPECT_FALSE(t.IsStop(3));
  EXPECT_EQ(t.After(3, 1, 5), FinishReason::kNone);
  EXPECT_EQ(t.After(7, 1, 5), FinishReason::kStop);
  EXPECT_EQ(t.After(2, 4, 11), FinishReason::kStop);     // a stop token wins over length and context
  EXPECT_EQ(t.After(3, 4, 11), FinishReason::kLength);   // length wins over context
  EXPECT_EQ(t.After(3, 2, 10), FinishReason::kNone);     // position 9 is still valid
  EXPECT_EQ(t.After(3, 2, 11), FinishReason::kContext);  // no position left for the new token
  TokenStops ignoring({7}, {2}, /*ignore_eos=*/true, 4, 10);
  EXPECT_FALSE(ignoring.IsStop(2));
  EXPECT_TRUE(ignoring.IsStop(7));
  EXPECT_EQ(TokenStops({}, {}, false, 1, 10).After(3, 1, 2), FinishReason::kLength);
}

TEST(StopStrings, HoldsBackAPossiblePrefixAndCutsBeforeTheStop) {
  StopStrings s({"END", "", "\n\n"});
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s.Push("Hello E"), "Hello ");  // "E" may begin "END"
  EXPECT_EQ(s.Push("x"), "Ex");            // it did not
  EXPECT_EQ(s.Push(" \n"), " ");           // "\n" may begin "\n\n"
  EXPECT_EQ(s.Push("E"), "\n");            // "\n" then "E": only "E" may still grow
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.Push("N"), "");              // "EN"
  EXPECT_EQ(s.Push("D and more"), "");     // "END": stop, nothing after it
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.Push("later"), "");
  EXPECT_EQ(s.Flush(), "");
}

TEST(StopStrings, StopInsideOnePieceAndFlushAtOtherEnds) {
  StopStrings s({"stop"});
  EXPECT_EQ(s.Push("abc stop def"), "abc ");
  EXPECT_TRUE(s.stopped());
  StopStrings t({"stop"});
  EXPECT_EQ(t.Push("abc st"), "abc ");
  EXPECT_EQ(t.Flush(), "st");  // the request ended for another reason: the held tail is final
  StopStrings none({});
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.Push("anything END"), "anything END");
  // Every text emitted before the stop, concatenated, is exactly the text before the stop.
  StopStrings u({"<|end|>"});
  std::string got;
  for (char c : std::string("one two <|e<|end|> three")) got += u.Push(std::string(1, c));
  EXPECT_EQ(got, "one two <|e");
  EXPECT_TRUE(u.stopped());
}

}  // namespace
}  // namespace icecache::model
