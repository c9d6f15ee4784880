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

TEST(SyntheticKeysTest, TopicsComeInRunsOfTheFamilysMeanLength) {
  for (const char* name : {"default", "scattered", "broad"}) {
    const SyntheticOptions o = SyntheticFamily(name).value();
    const auto d = MakeSyntheticData(20000, 16, 1, o);
    ASSERT_EQ(d.topic.size(), 20000u) << name;
    int runs = 1;
    for (size_t t = 0; t < d.topic.size(); ++t) {
      EXPECT_GE(d.topic[t], 0) << name;
      EXPECT_LT(d.topic[t], o.num_topics) << name;
      if (t > 0 && d.topic[t] != d.topic[t - 1]) ++runs;
    }
    // A new run starts with probability 1/run_mean and draws the same topic again with 1/num_topics.
    const double expected = o.run_mean / (1.0 - 1.0 / o.num_topics);
    EXPECT_NEAR(20000.0 / runs, expected, 0.15 * expected) << name;
  }
}

TEST(SyntheticKeysTest, KeysOfOneTopicAreNearerToEachOtherThanToOtherTopics) {
  SyntheticOptions o;
  o.rope_base = 0;  // without the rotation the topic is the whole signal
  o.outlier_channels = 0;
  const auto d = MakeSyntheticData(4000, 32, 1, o);
  double same = 0, other = 0;
  int ns = 0, no = 0;
  for (int t = 2; t < 4000; t += 7)
    for (int u = t + 1; u < 4000; u += 131) {
      double dist = 0;
      for (int i = 0; i < 32; ++i) {
        const double x = d.keys[static_cast<size_t>(t) * 32 + i] - d.keys[static_cast<size_t>(u) * 32 + i];
        dist += x * x;
      }
      if (d.topic[t] == d.topic[u]) same += dist, ++ns;
      else other += dist, ++no;
    }
  ASSERT_GT(ns, 10);
  ASSERT_GT(no, 10);
  EXPECT_LT(same / ns, 0.6 * (other / no));
}

}  // namespace
}  // namespace icecache::kvstore
