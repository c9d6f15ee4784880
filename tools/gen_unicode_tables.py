#!/usr/bin/env python3
"""Generates the Unicode tables of model/tokenizer/unicode_tables.h from Python's unicodedata.

Usage: python3 tools/gen_unicode_tables.py model/tokenizer

writes one .cc per concept into that folder: unicode_classes.cc (version, \\p{L}, \\p{N}, \\s),
unicode_classes_extra.cc (\\p{P}, Rust's \\w), unicode_compat.cc (NFKD of compatibility characters: the index by code point),
unicode_compat_data.cc (their code points),
unicode_nfc.cc (NFC fast-path ranges, combining classes, compositions),
unicode_decompositions.cc and unicode_case_folds.cc.

Tables (all sorted by code point, ranges inclusive):
  * letters (general category L*), numbers (N*): \\p{L}, \\p{N} of the pre-tokenizer regexes;
  * White_Space (PropList.txt, what Oniguruma and Rust's regex use for \\s);
  * canonical combining classes, canonical decompositions (one level; applied recursively),
    canonical compositions (primary composites only: exclusions derived from NFC itself),
    code points that can make a string non-NFC (fast path);
  * simple case folding (for (?i:...)).
The Unicode version is Python's unicodedata.unidata_version and is written into the file.
"""
import sys
import unicodedata

MAX = 0x110000

# White_Space from PropList.txt (stable since Unicode 6.3, when U+180E left it). Checked below
# against Python's str.isspace(), which adds the bidi-class B/S controls U+001C..U+001F.
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]


def ranges(pred):
    out, start = [], None
    for cp in range(MAX):
        if pred(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, MAX - 1))
    return out


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF


def main():
    ws = set()
    for lo, hi in WHITE_SPACE:
        ws.update(range(lo, hi + 1))
    py_space = {cp for cp in range(MAX) if chr(cp).isspace()} - set(range(0x1C, 0x20))
    assert ws == py_space, sorted(ws ^ py_space)

    letters = ranges(lambda cp: unicodedata.category(chr(cp)).startswith('L'))
    numbers = ranges(lambda cp: unicodedata.category(chr(cp)).startswith('N'))
    punctuation = ranges(lambda cp: unicodedata.category(chr(cp)).startswith('P'))
    # Rust regex's \w: Alphabetic, M*, Nd, Pc, Join_Control. Alphabetic is L*, Nl and
    # Other_Alphabetic; unicodedata lacks the latter, whose members outside M* are the circled and
    # squared Latin letters listed here (PropList.txt, Unicode 14).
    other_alphabetic_so = [(0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189)]

    def is_word(cp):
        cat = unicodedata.category(chr(cp))
        return (cat[0] in 'LM' or cat in ('Nl', 'Nd', 'Pc') or cp in (0x200C, 0x200D) or
                any(lo <= cp <= hi for lo, hi in other_alphabetic_so))
    word = ranges(is_word)

    # Compatibility decompositions for NFKC: every code point whose NFKD differs from its NFD,
    # mapped to its full NFKD (already recursive and canonically ordered).
    compat, compat_data = [], []
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        ch = chr(cp)
        k = unicodedata.normalize('NFKD', ch)
        if k != unicodedata.normalize('NFD', ch):
            compat.append((cp, len(compat_data), len(k)))
            compat_data.extend(ord(c) for c in k)

    ccc = []  # (lo, hi, class)
    for cp in range(MAX):
        c = unicodedata.combining(chr(cp))
        if c:
            if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == c:
                ccc[-1] = (ccc[-1][0], cp, c)
            else:
                ccc.append((cp, cp, c))

    decomp = []  # (cp, first, second or 0)
    compose = []  # (first, second, composite)
    for cp in range(MAX):
        if is_surrogate(cp) or 0xAC00 <= cp <= 0xD7A3:
            continue  # Hangul syllables are algorithmic
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith('<'):
            continue
        parts = [int(x, 16) for x in d.split()]
        assert 1 <= len(parts) <= 2
        decomp.append((cp, parts[0], parts[1] if len(parts) == 2 else 0))
        # A primary composite is one that NFC keeps; exclusions and singletons are not.
        if len(parts) == 2 and unicodedata.normalize('NFC', chr(cp)) == chr(cp):
            compose.append((parts[0], parts[1], cp))
    compose.sort()
    seconds = {s for _, s, _ in compose} | set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))

    def unsafe(cp):
        if is_surrogate(cp):
            return False
        ch = chr(cp)
        return (unicodedata.combining(ch) != 0 or cp in seconds or
                unicodedata.normalize('NFC', ch) != ch)
    nfc_unsafe = ranges(unsafe)

    fold = []
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        ch = chr(cp)
        f = ch.casefold()
        if len(f) != 1:
            f = ch.lower()
        if len(f) == 1 and f != ch:
            fold.append((cp, ord(f)))

    out_dir = sys.argv[1] if len(sys.argv) > 1 else '.'
    header = ('// GENERATED by tools/gen_unicode_tables.py from Python %s unicodedata (Unicode %s).\n'
              '// Do not edit by hand; rerun the script.\n'
              '#include "model/tokenizer/unicode_tables.h"\n\nnamespace icecache::tokenizer::tables {\n\n'
              % (sys.version.split()[0], unicodedata.unidata_version))

    def emit(w, name, typ, rows, fmt):
        w('const %s %s[] = {\n' % (typ, name))
        line = '   '
        for r in rows:
            item = ' ' + fmt(r) + ','
            if len(line) + len(item) > 100:
                w(line + '\n')
                line = '   '
            line += item
        w(line + '\n};\n')
        w('const int %sSize = %d;\n\n' % (name, len(rows)))

    rng = lambda r: '{0x%X, 0x%X}' % r
    triple = lambda r: '{0x%X, 0x%X, 0x%X}' % r
    files = {
        'unicode_classes.cc': [('kLetterRanges', 'Range', letters, rng), ('kNumberRanges', 'Range', numbers, rng),
                               ('kWhiteSpaceRanges', 'Range', WHITE_SPACE, rng)],
        'unicode_classes_extra.cc': [('kPunctuationRanges', 'Range', punctuation, rng),
                                     ('kWordRanges', 'Range', word, rng)],
        'unicode_compat.cc': [('kCompatDecompositions', 'CompatDecomposition', compat,
                               lambda r: '{0x%X, %d, %d}' % r)],
        'unicode_compat_data.cc': [('kCompatData', 'char32_t', compat_data, lambda c: '0x%X' % c)],
        'unicode_nfc.cc': [('kNfcUnsafeRanges', 'Range', nfc_unsafe, rng),
                           ('kCombiningClasses', 'ClassRange', ccc, lambda r: '{0x%X, 0x%X, %d}' % r),
                           ('kCompositions', 'Composition', compose, triple)],
        'unicode_decompositions.cc': [('kDecompositions', 'Decomposition', decomp, triple)],
        'unicode_case_folds.cc': [('kCaseFolds', 'CaseFold', fold, lambda r: '{0x%X, 0x%X}' % r)],
    }
    for fname, tables in files.items():
        with open('%s/%s' % (out_dir, fname), 'w') as f:
            w = f.write
            w(header)
            if fname == 'unicode_classes.cc':
                w('const char kUnicodeVersion[] = "%s";\n\n' % unicodedata.unidata_version)
            for t in tables:
                emit(w, *t)
            w('}  // namespace icecache::tokenizer::tables\n')


if __name__ == '__main__':
    main()
