// The named synthetic key families (kvstore::SyntheticFamily).
#include "kvstore/synthetic_keys.h"

#include <gtest/gtest.h>

#include <sstream>

namespace icecache::kvstore {
namespace {

TEST(SyntheticKeysTest, EveryFamilyParsesAndUnknownIsRefused) {
  std::stringstream ss(kSyntheticFamilies);
  int count = 0;
  for (std::string name; std::getline(ss, name, ',');) {
    auto o = SyntheticFamily(name);
    ASSERT_TRUE(o.ok()) << name << ": " << o.status().ToString();
    ++count;
  }
  EXPECT_EQ(count, 6);
  auto bad = SyntheticFamily("easy");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("scattered"), std::string::npos);
}

TEST(SyntheticKeysTest, DefaultFamilyIsTheDefaultDataAndDriftMovesOnlyQueries) {
  const auto a = MakeSyntheticData(500, 32, 8);
  const auto b = MakeSyntheticData(500, 32, 8, SyntheticFamily("default").value());
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.queries, b.queries);
  SyntheticOptions drift;
  drift.query_drift = 0.5;
  const auto c = MakeSyntheticData(500, 32, 8, drift);
  EXPECT_EQ(a.keys, c.keys);
  EXPECT_NE(a.queries, c.queries);
  const auto h = MakeSyntheticData(500, 32, 8, SyntheticFamily("hard").value());
  EXPECT_NE(a.keys, h.keys);
  EXPECT_EQ(MakeSyntheticData(500, 32, 8, SyntheticFamily("hard").value()).queries, h.queries);  // deterministic
}

}  // namespace
}  // namespace icecache::kvstore
