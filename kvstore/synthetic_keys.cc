#include "kvstore/synthetic_keys.h"

#include <cmath>
#include <algorithm>
#include <random>

namespace icecache::kvstore {
namespace {

void Rope(float* x, int dim, double pos, double base) {
  if (base <= 0) return;
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    const double theta = pos * std::pow(base, -2.0 * i / dim);
    const double c = std::cos(theta), s = std::sin(theta);
    const double a = x[i], b = x[i + half];
    x[i] = static_cast<float>(a * c - b * s);
    x[i + half] = static_cast<float>(a * s + b * c);
  }
}

}  // namespace

SyntheticData MakeSyntheticData(int n, int dim, int num_queries, const SyntheticOptions& o) {
  SyntheticData d;
  d.n = n;
  d.dim = dim;
  d.num_queries = num_queries;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int half = dim / 2;
  // Channel weights: topic signal mostly in the low-frequency pairs (high pair index).
  std::vector<float> weight(dim);
  for (int i = 0; i < dim; ++i) {
    const int pair = i % std::max(1, half);
    weight[i] = static_cast<float>(0.25 + 1.75 * std::pow(static_cast<double>(pair) / std::max(1, half - 1), 2.0));
  }
  std::vector<float> centers(static_cast<size_t>(o.num_topics) * dim);
  for (auto& c : centers) c = g(rng);
  for (int t = 0; t < o.num_topics; ++t)
    for (int i = 0; i < dim; ++i) centers[static_cast<size_t>(t) * dim + i] *= weight[i];
  std::vector<float> outlier(dim, 0.f);
  for (int j = 0; j < o.outlier_channels && j < dim; ++j) outlier[(j * 37 + 5) % dim] = static_cast<float>(o.outlier_scale * (j % 2 ? -1 : 1));
  std::vector<float> qbias(dim);
  for (auto& b : qbias) b = 0.5f * g(rng);
  std::vector<float> sink(dim);
  for (int i = 0; i < dim; ++i) sink[i] = qbias[i] * 4.f;

  d.keys.resize(static_cast<size_t>(n) * dim);
  d.values.resize(d.keys.size());
  std::vector<int32_t>& topic_of = d.topic;
  topic_of.resize(n);
  int topic = 0;
  for (int t = 0; t < n; ++t) {
    if (t == 0 || u(rng) < 1.0 / o.run_mean) topic = static_cast<int>(rng() % o.num_topics);
    topic_of[t] = topic;
    float* k = d.keys.data() + static_cast<size_t>(t) * dim;
    const float* c = centers.data() + static_cast<size_t>(topic) * dim;
    for (int i = 0; i < dim; ++i) k[i] = c[i] + static_cast<float>(o.key_noise) * g(rng) + outlier[i];
    if (t == 0 && o.sink_token)
      for (int i = 0; i < dim; ++i) k[i] = sink[i] + outlier[i];
    Rope(k, dim, t, o.rope_base);
    float* v = d.values.data() + static_cast<size_t>(t) * dim;
    for (int i = 0; i < dim; ++i) v[i] = g(rng);
  }
  d.queries.resize(static_cast<size_t>(num_queries) * dim);
  for (int j = 0; j < num_queries; ++j) {
    // Ask about the topic of a random earlier token (so the topic is present in the context).
    const int tq = n > 0 ? topic_of[rng() % n] : 0;
    const float* c = centers.data() + static_cast<size_t>(tq) * dim;
    float* q = d.queries.data() + static_cast<size_t>(j) * dim;
    for (int i = 0; i < dim; ++i)
      q[i] = static_cast<float>(o.query_scale) * (c[i] + static_cast<float>(o.query_noise) * g(rng)) + qbias[i];
    if (o.query_drift > 0) {
      std::vector<float> r(dim);
      double qn = 0, rn = 0;
      for (int i = 0; i < dim; ++i) {
        r[i] = g(rng);
        qn += double(q[i]) * q[i];
        rn += double(r[i]) * r[i];
      }
      const double f = std::sqrt(qn / std::max(rn, 1e-30));
      for (int i = 0; i < dim; ++i) q[i] = static_cast<float>((1 - o.query_drift) * q[i] + o.query_drift * f * r[i]);
    }
    Rope(q, dim, n, o.rope_base);
  }
  return d;
}

StatusOr<SyntheticOptions> SyntheticFamily(const std::string& name) {
  SyntheticOptions o;
  const bool hard = name == "hard";
  if (name == "default") return o;
  if (name == "scattered" || hard) o.num_topics = 256, o.run_mean = 3;
  if (name == "outliers" || hard) o.outlier_channels = 8, o.outlier_scale = 10, o.key_noise = 0.8;
  if (name == "drift" || hard) o.query_drift = 0.5, o.query_noise = 1.0;
  if (name == "broad") o.num_topics = 16, o.run_mean = 96, o.key_noise = 1.2;
  if (name != "scattered" && name != "outliers" && name != "drift" && name != "broad" && !hard)
    return InvalidArgumentError("unknown synthetic family '" + name + "' (known: " + kSyntheticFamilies + ")");
  return o;
}

}  // namespace icecache::kvstore
