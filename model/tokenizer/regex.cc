#include "model/tokenizer/regex.h"

#include <bitset>
#include <limits>
#include <string>

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

enum Property : uint8_t { kPropLetter, kPropNumber, kPropSpace };

struct CharClass {
  bool negate = false;
  bool icase = false;
  std::vector<std::pair<char32_t, char32_t>> ranges;
  std::vector<std::pair<Property, bool>> props;  // (property, negated)
  std::bitset<128> ascii;                        // precomputed result for ASCII code points

  bool RawMatch(char32_t c) const {
    for (const auto& [lo, hi] : ranges) {
      if (c >= lo && c <= hi) return true;
    }
    for (const auto& [p, neg] : props) {
      bool in = p == kPropLetter ? IsLetter(c) : p == kPropNumber ? IsNumber(c) : IsWhiteSpace(c);
      if (in != neg) return true;
    }
    return false;
  }
  bool SlowMatch(char32_t c) const {
    bool in = RawMatch(c);
    if (!in && icase) {
      char32_t f = SimpleCaseFold(c);
      in = (f != c && RawMatch(f)) || (c >= 'a' && c <= 'z' && RawMatch(c - 32));
      if (!in) {
        for (const auto& [lo, hi] : ranges) {
          for (char32_t x = lo; x <= hi && x - lo < 256; ++x) {
            if (SimpleCaseFold(x) == f) return !negate;
          }
        }
      }
    }
    return in != negate;
  }
  void Finish() {
    for (char32_t c = 0; c < 128; ++c) ascii[c] = SlowMatch(c);
  }
  bool Matches(char32_t c) const { return c < 128 ? ascii[c] : SlowMatch(c); }
};

enum class Op : uint8_t { kSet, kRepeatSet, kSplit, kJmp, kLook, kMatch };

struct Inst {
  Op op;
  bool greedy = true;  // kRepeatSet
  bool negate = false; // kLook
  int cls = -1;        // kSet, kRepeatSet
  int x = 0, y = 0;    // kSplit (prefer x), kJmp (x), kLook (sub-program x)
  uint32_t min = 0, max = 0;
};

struct Node {
  enum Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kLook } kind = kEmpty;
  int cls = -1;
  std::vector<std::unique_ptr<Node>> kids;
  uint32_t min = 0, max = 0;
  bool greedy = true;
  bool negate = false;
};

constexpr uint32_t kInfinite = std::numeric_limits<uint32_t>::max();
constexpr int kMaxGroupDepth = 100;
constexpr size_t kMaxProgramSize = 100000;

}  // namespace

struct Regex::Program {
  std::vector<CharClass> classes;
  std::vector<std::vector<Inst>> progs;  // progs[0] is the main program; others are lookaheads
};

namespace {

class Parser {
 public:
  Parser(std::string_view pattern, Regex::Program* prog) : pattern_(pattern), prog_(prog) {
    CodePoints cps = DecodeAll(pattern);
    p_ = std::move(cps.cps);
  }

  StatusOr<std::unique_ptr<Node>> Parse() {
    bool icase = false;
    ICE_ASSIGN_OR_RETURN(auto node, ParseAlt(&icase));
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    return node;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgumentError("regex \"" + std::string(pattern_) + "\": " + what +
                                " at character " + std::to_string(pos_));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char32_t Peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : 0; }

  int AddClass(CharClass c) {
    c.Finish();
    prog_->classes.push_back(std::move(c));
    return static_cast<int>(prog_->classes.size()) - 1;
  }
  std::unique_ptr<Node> SetNode(CharClass c) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->cls = AddClass(std::move(c));
    return n;
  }

  StatusOr<std::unique_ptr<Node>> ParseAlt(bool* icase) {
    std::vector<std::unique_ptr<Node>> alts;
    while (true) {
      ICE_ASSIGN_OR_RETURN(auto c, ParseConcat(icase));
      alts.push_back(std::move(c));
      if (!AtEnd() && Peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alts.size() == 1) return std::move(alts[0]);
    auto n = std::make_unique<Node>();
    n->kind = Node::kAlt;
    n->kids = std::move(alts);
    return n;
  }

  StatusOr<std::unique_ptr<Node>> ParseConcat(bool* icase) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      // Inline flag group "(?i)" applies to the rest of the enclosing group.
      if (Peek() == '(' && Peek(1) == '?' && Peek(2) == 'i' && Peek(3) == ')') {
        pos_ += 4;
        *icase = true;
        continue;
      }
      ICE_ASSIGN_OR_RETURN(auto atom, ParseAtom(*icase));
      ICE_ASSIGN_OR_RETURN(atom, ParseQuantifier(std::move(atom)));
      n->kids.push_back(std::move(atom));
    }
    return n;
  }

  StatusOr<std::unique_ptr<Node>> ParseQuantifier(std::unique_ptr<Node> atom) {
    if (AtEnd()) return atom;
    uint32_t min, max;
    char32_t c = Peek();
    if (c == '?') { min = 0; max = 1; ++pos_; }
    else if (c == '*') { min = 0; max = kInfinite; ++pos_; }
    else if (c == '+') { min = 1; max = kInfinite; ++pos_; }
    else if (c == '{') {
      size_t save = pos_;
      ++pos_;
      auto number = [&](uint32_t* v) {
        if (AtEnd() || Peek() < '0' || Peek() > '9') return false;
        uint64_t x = 0;
        while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
          x = x * 10 + (Peek() - '0');
          if (x > 100000) return false;
          ++pos_;
        }
        *v = static_cast<uint32_t>(x);
        return true;
      };
      if (!number(&min)) { pos_ = save; return Error("unsupported '{' (not a {n,m} quantifier)"); }
      max = min;
      if (Peek() == ',') {
        ++pos_;
        if (Peek() == '}') max = kInfinite;
        else if (!number(&max)) return Error("bad {n,m} quantifier");
      }
      if (Peek() != '}') return Error("bad {n,m} quantifier");
      ++pos_;
      if (max < min) return Error("quantifier {n,m} with m < n");
    } else {
      return atom;
    }
    bool greedy = true;
    if (Peek() == '?') { greedy = false; ++pos_; }
    else if (Peek() == '+') return Error("possessive quantifiers are not supported");
    if (!AtEnd() && (Peek() == '?' || Peek() == '*' || Peek() == '+' || Peek() == '{')) {
      return Error("nested quantifier");
    }
    if (atom->kind == Node::kLook) return Error("quantified lookahead");
    auto n = std::make_unique<Node>();
    n->kind = Node::kRepeat;
    n->min = min;
    n->max = max;
    n->greedy = greedy;
    n->kids.push_back(std::move(atom));
    return n;
  }

  StatusOr<std::unique_ptr<Node>> ParseAtom(bool icase) {
    char32_t c = Peek();
    if (c == '(') {
      ++pos_;
      bool group_icase = icase;
      bool look = false, negate = false;
      if (Peek() == '?') {
        if (Peek(1) == ':') { pos_ += 2; }
        else if (Peek(1) == 'i' && Peek(2) == ':') { pos_ += 3; group_icase = true; }
        else if (Peek(1) == '-' && Peek(2) == 'i' && Peek(3) == ':') { pos_ += 4; group_icase = false; }
        else if (Peek(1) == '=') { pos_ += 2; look = true; }
        else if (Peek(1) == '!') { pos_ += 2; look = true; negate = true; }
        else return Error("unsupported group syntax '(?'");
      }
      if (++depth_ > kMaxGroupDepth) return Error("groups nested too deeply");
      ICE_ASSIGN_OR_RETURN(auto inner, ParseAlt(&group_icase));
      --depth_;
      if (Peek() != ')') return Error("missing ')'");
      ++pos_;
      if (!look) return inner;
      auto n = std::make_unique<Node>();
      n->kind = Node::kLook;
      n->negate = negate;
      n->kids.push_back(std::move(inner));
      return n;
    }
    if (c == '[') return ParseClass(icase);
    if (c == '.') {
      ++pos_;
      CharClass cc;
      cc.negate = true;
      cc.ranges.push_back({'\n', '\n'});
      return SetNode(std::move(cc));
    }
    if (c == '\\') {
      CharClass cc;
      cc.icase = icase;
      ICE_RETURN_IF_ERROR(ParseEscape(&cc));
      return SetNode(std::move(cc));
    }
    if (c == '^' || c == '$') return Error("anchors are not supported");
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("quantifier without operand");
    ++pos_;
    CharClass cc;
    cc.icase = icase;
    cc.ranges.push_back({c, c});
    return SetNode(std::move(cc));
  }

  // Parses "\..." at pos_ into cc (adds a range or a property). Returns in *single the literal
  // code point when the escape is one character (for ranges in classes), else kInvalidCodePoint.
  Status ParseEscape(CharClass* cc, char32_t* single = nullptr) {
    if (single) *single = kInvalidCodePoint;
    ++pos_;  // backslash
    if (AtEnd()) return Error("trailing backslash");
    char32_t e = Peek();
    ++pos_;
    auto literal = [&](char32_t v) {
      cc->ranges.push_back({v, v});
      if (single) *single = v;
      return Status::Ok();
    };
    auto hex = [&](size_t digits, bool braced) -> StatusOr<char32_t> {
      uint32_t v = 0;
      size_t n = 0;
      if (braced) {
        if (Peek() != '{') return Error("expected '{'");
        ++pos_;
      }
      while (!AtEnd() && (braced ? Peek() != '}' : n < digits)) {
        char32_t h = Peek();
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0 || n >= 6) return Error("bad hex escape");
        v = v * 16 + d;
        ++n;
        ++pos_;
      }
      if (braced) {
        if (Peek() != '}') return Error("bad hex escape");
        ++pos_;
      }
      if (n == 0 || (!braced && n != digits) || v > 0x10FFFF) return Error("bad hex escape");
      return static_cast<char32_t>(v);
    };
    switch (e) {
      case 'n': return literal('\n');
      case 'r': return literal('\r');
      case 't': return literal('\t');
      case 'f': return literal('\f');
      case 'v': return literal('\v');
      case 'x': {
        ICE_ASSIGN_OR_RETURN(char32_t v, hex(2, Peek() == '{'));
        return literal(v);
      }
      case 'u': {
        ICE_ASSIGN_OR_RETURN(char32_t v, hex(4, false));
        return literal(v);
      }
      case 's': cc->props.push_back({kPropSpace, false}); return Status::Ok();
      case 'S': cc->props.push_back({kPropSpace, true}); return Status::Ok();
      case 'p':
      case 'P': {
        std::u32string name;
        if (Peek() == '{') {
          ++pos_;
          while (!AtEnd() && Peek() != '}') name.push_back(p_[pos_++]);
          if (AtEnd()) return Error("unterminated \\p{");
          ++pos_;
        } else if (!AtEnd()) {
          name.push_back(p_[pos_++]);
        }
        bool neg = e == 'P';
        if (!name.empty() && name[0] == '^') {
          neg = !neg;
          name.erase(0, 1);
        }
        if (name == U"L" || name == U"Letter") cc->props.push_back({kPropLetter, neg});
        else if (name == U"N" || name == U"Number") cc->props.push_back({kPropNumber, neg});
        else return Error("unsupported Unicode property (only \\p{L}, \\p{N})");
        return Status::Ok();
      }
      default:
        if (e < 128 && !((e | 0x20) >= 'a' && (e | 0x20) <= 'z') && !(e >= '0' && e <= '9')) {
          return literal(e);
        }
        --pos_;
        return Error(std::string("unsupported escape '\\") + static_cast<char>(e < 128 ? e : '?') + "'");
    }
  }

  StatusOr<std::unique_ptr<Node>> ParseClass(bool icase) {
    ++pos_;  // '['
    CharClass cc;
    cc.icase = icase;
    if (Peek() == '^') {
      cc.negate = true;
      ++pos_;
    }
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      char32_t c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[') return Error("nested character classes are not supported");
      char32_t lo;
      if (c == '\\') {
        ICE_RETURN_IF_ERROR(ParseEscape(&cc, &lo));
        if (lo == kInvalidCodePoint) continue;  // a property
        cc.ranges.pop_back();
      } else {
        lo = c;
        ++pos_;
      }
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < p_.size()) {
        ++pos_;
        char32_t hi;
        if (Peek() == '\\') {
          ICE_RETURN_IF_ERROR(ParseEscape(&cc, &hi));
          if (hi == kInvalidCodePoint) return Error("bad range in character class");
          cc.ranges.pop_back();
        } else {
          hi = Peek();
          ++pos_;
        }
        if (hi < lo) return Error("bad range in character class");
        cc.ranges.push_back({lo, hi});
      } else {
        cc.ranges.push_back({lo, lo});
      }
    }
    return SetNode(std::move(cc));
  }

  std::string_view pattern_;
  Regex::Program* prog_;
  std::vector<char32_t> p_;
  size_t pos_ = 0;
  int depth_ = 0;
};

bool Nullable(const Node& n) {
  switch (n.kind) {
    case Node::kEmpty: case Node::kLook: return true;
    case Node::kSet: return false;
    case Node::kConcat:
      for (const auto& k : n.kids) if (!Nullable(*k)) return false;
      return true;
    case Node::kAlt:
      for (const auto& k : n.kids) if (Nullable(*k)) return true;
      return false;
    case Node::kRepeat: return n.min == 0 || Nullable(*n.kids[0]);
  }
  return true;
}

class Compiler {
 public:
  explicit Compiler(Regex::Program* prog) : prog_(prog) {}

  Status CompileInto(const Node& n, int prog_index) {
    ICE_RETURN_IF_ERROR(Emit(n, prog_index));
    Code(prog_index).push_back(Inst{Op::kMatch});
    if (Code(prog_index).size() > kMaxProgramSize) return InvalidArgumentError("regex too large");
    return Status::Ok();
  }

 private:
  std::vector<Inst>& Code(int p) { return prog_->progs[p]; }

  Status Emit(const Node& n, int p) {
    switch (n.kind) {
      case Node::kEmpty: return Status::Ok();
      case Node::kSet: {
        Inst i{Op::kSet};
        i.cls = n.cls;
        Code(p).push_back(i);
        return Status::Ok();
      }
      case Node::kConcat:
        for (const auto& k : n.kids) ICE_RETURN_IF_ERROR(Emit(*k, p));
        return Status::Ok();
      case Node::kAlt: {
        std::vector<size_t> jumps;
        for (size_t a = 0; a < n.kids.size(); ++a) {
          size_t split = 0;
          if (a + 1 < n.kids.size()) {
            split = Code(p).size();
            Code(p).push_back(Inst{Op::kSplit});
            Code(p)[split].x = static_cast<int>(split + 1);
          }
          ICE_RETURN_IF_ERROR(Emit(*n.kids[a], p));
          if (a + 1 < n.kids.size()) {
            jumps.push_back(Code(p).size());
            Code(p).push_back(Inst{Op::kJmp});
            Code(p)[split].y = static_cast<int>(Code(p).size());
          }
        }
        for (size_t j : jumps) Code(p)[j].x = static_cast<int>(Code(p).size());
        return Status::Ok();
      }
      case Node::kLook: {
        int sub = static_cast<int>(prog_->progs.size());
        prog_->progs.emplace_back();
        ICE_RETURN_IF_ERROR(CompileInto(*n.kids[0], sub));
        Inst i{Op::kLook};
        i.x = sub;
        i.negate = n.negate;
        Code(p).push_back(i);
        return Status::Ok();
      }
      case Node::kRepeat: {
        const Node& body = *n.kids[0];
        if (body.kind == Node::kSet) {
          Inst i{Op::kRepeatSet};
          i.cls = body.cls;
          i.min = n.min;
          i.max = n.max;
          i.greedy = n.greedy;
          Code(p).push_back(i);
          return Status::Ok();
        }
        if (n.max == kInfinite && Nullable(body)) {
          return InvalidArgumentError("regex: unbounded repetition of a sub-pattern that can match empty");
        }
        if (n.max != kInfinite && n.max > 1000) return InvalidArgumentError("regex: repetition count too large");
        for (uint32_t r = 0; r < n.min; ++r) {
          ICE_RETURN_IF_ERROR(Emit(body, p));
          if (Code(p).size() > kMaxProgramSize) return InvalidArgumentError("regex too large");
        }
        if (n.max == kInfinite) {
          size_t split = Code(p).size();
          Code(p).push_back(Inst{Op::kSplit});
          ICE_RETURN_IF_ERROR(Emit(body, p));
          Inst j{Op::kJmp};
          j.x = static_cast<int>(split);
          Code(p).push_back(j);
          SetSplit(p, split, split + 1, Code(p).size(), n.greedy);
        } else {
          std::vector<size_t> splits;
          for (uint32_t r = n.min; r < n.max; ++r) {
            splits.push_back(Code(p).size());
            Code(p).push_back(Inst{Op::kSplit});
            ICE_RETURN_IF_ERROR(Emit(body, p));
            if (Code(p).size() > kMaxProgramSize) return InvalidArgumentError("regex too large");
          }
          for (size_t s : splits) SetSplit(p, s, s + 1, Code(p).size(), n.greedy);
        }
        if (Code(p).size() > kMaxProgramSize) return InvalidArgumentError("regex too large");
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  void SetSplit(int p, size_t at, size_t body, size_t after, bool greedy) {
    Code(p)[at].x = static_cast<int>(greedy ? body : after);
    Code(p)[at].y = static_cast<int>(greedy ? after : body);
  }

  Regex::Program* prog_;
};

struct Backtrack {
  int pc;
  uint32_t lo, hi;  // positions to retry, inclusive; kind says the order
  uint8_t kind;     // 0: single position lo; 1: hi down to lo; 2: lo up to hi
};

ptrdiff_t Run(const Regex::Program& prog, int which, const std::vector<char32_t>& cps, size_t start,
              std::vector<Backtrack>* stack) {
  const std::vector<Inst>& code = prog.progs[which];
  const size_t base = stack->size();
  const size_t n = cps.size();
  int pc = 0;
  size_t pos = start;
  while (true) {
    const Inst& in = code[pc];
    bool fail = false;
    switch (in.op) {
      case Op::kSet:
        if (pos < n && prog.classes[in.cls].Matches(cps[pos])) {
          ++pos;
          ++pc;
        } else {
          fail = true;
        }
        break;
      case Op::kRepeatSet: {
        const CharClass& cc = prog.classes[in.cls];
        size_t limit = in.max == kInfinite ? n : std::min(n, pos + in.max);
        size_t end = pos;
        if (in.greedy) {
          while (end < limit && cc.Matches(cps[end])) ++end;
          if (end - pos < in.min) { fail = true; break; }
          if (end - pos > in.min) {
            stack->push_back({pc + 1, static_cast<uint32_t>(pos + in.min),
                              static_cast<uint32_t>(end - 1), 1});
          }
          pos = end;
        } else {
          size_t need = pos + in.min;
          while (end < need && end < n && cc.Matches(cps[end])) ++end;
          if (end < need) { fail = true; break; }
          // Lazy: later tries extend one character at a time while the class still matches.
          size_t ext = end;
          while (ext < limit && cc.Matches(cps[ext])) ++ext;
          if (ext > end) {
            stack->push_back({pc + 1, static_cast<uint32_t>(end + 1), static_cast<uint32_t>(ext), 2});
          }
          pos = end;
        }
        ++pc;
        break;
      }
      case Op::kSplit:
        stack->push_back({in.y, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos), 0});
        pc = in.x;
        break;
      case Op::kJmp:
        pc = in.x;
        break;
      case Op::kLook: {
        bool matched = Run(prog, in.x, cps, pos, stack) >= 0;
        if (matched != in.negate) ++pc;
        else fail = true;
        break;
      }
      case Op::kMatch:
        stack->resize(base);
        return static_cast<ptrdiff_t>(pos);
    }
    if (!fail) continue;
    if (stack->size() == base) return -1;
    Backtrack& b = stack->back();
    pc = b.pc;
    if (b.kind == 0) {
      pos = b.lo;
      stack->pop_back();
    } else if (b.kind == 1) {
      pos = b.hi;
      if (b.hi == b.lo) stack->pop_back(); else --b.hi;
    } else {
      pos = b.lo;
      if (b.hi == b.lo) stack->pop_back(); else ++b.lo;
    }
  }
}

}  // namespace

StatusOr<Regex> Regex::Compile(std::string_view pattern) {
  if (!IsValidUtf8(pattern)) return InvalidArgumentError("regex: pattern is not valid UTF-8");
  auto prog = std::make_shared<Program>();
  Parser parser(pattern, prog.get());
  ICE_ASSIGN_OR_RETURN(auto root, parser.Parse());
  prog->progs.emplace_back();
  Compiler compiler(prog.get());
  ICE_RETURN_IF_ERROR(compiler.CompileInto(*root, 0));
  Regex r;
  r.program_ = std::move(prog);
  return r;
}

ptrdiff_t Regex::MatchAt(const std::vector<char32_t>& cps, size_t start) const {
  std::vector<Backtrack> stack;
  return Run(*program_, 0, cps, start, &stack);
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(const std::vector<char32_t>& cps) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::vector<Backtrack> stack;
  stack.reserve(64);
  size_t pos = 0;
  while (pos < cps.size()) {
    ptrdiff_t end = Run(*program_, 0, cps, pos, &stack);
    if (end > static_cast<ptrdiff_t>(pos)) {
      out.emplace_back(pos, static_cast<size_t>(end));
      pos = static_cast<size_t>(end);
    } else {
      ++pos;
    }
  }
  return out;
}

}  // namespace icecache::tokenizer
