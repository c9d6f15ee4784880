// AMX tile helpers shared by the avx512 target's bf16 GEMM (matmul_cpu.cc) and prefill attention
// (prefill_attention_cpu.cc). Included after kernels/cpu/simd.h; defines nothing on other targets.
//
// `tdpbf16ps` (C += A · B): A a 16 x 32 bf16 tile (16 rows, 32 elements of the shared dimension
// per row, 64 bytes), B a 16 x 16 tile of bf16 pairs ("VNNI" layout: row r holds, for each of 16
// output columns, the elements 2r and 2r + 1 of the shared dimension), C 16 x 16 fp32. Used only
// where kernels::AmxActive() (kernels/simd_target.h): the CPU has AMX-TILE + AMX-BF16 and Linux
// granted the tile state. Each OpenMP thread loads AmxTileConfig before its first tile
// instruction and calls _tile_release() when done.
#pragma once

#if ICE_SIMD_AVX512
#include <cstdint>

namespace icecache::kernels::cpu::ICE_SIMD_NS {

// The 64-byte tile configuration (palette 1): all eight tiles 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};

// out[c * 16 + r] = in[r * 16 + c] for 32-bit elements, 16 x 16 (rows given as vectors): turns
// 16 rows of bf16 pairs into one B tile.
inline void Transpose16x16(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int j = 0; j < 4; ++j) {
    b[4 * j + 0] = _mm512_unpacklo_epi64(a[4 * j], a[4 * j + 2]);
    b[4 * j + 1] = _mm512_unpackhi_epi64(a[4 * j], a[4 * j + 2]);
    b[4 * j + 2] = _mm512_unpacklo_epi64(a[4 * j + 1], a[4 * j + 3]);
    b[4 * j + 3] = _mm512_unpackhi_epi64(a[4 * j + 1], a[4 * j + 3]);
  }
  // b[4j + c], 128-bit lane L: rows 4j..4j+3 of column 4L + c; gather the lanes.
  for (int c = 0; c < 4; ++c) {
    const __m512i e0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i e1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
    const __m512i e2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i e3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
    r[0 + c] = _mm512_shuffle_i32x4(e0, e2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(e0, e2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(e1, e3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(e1, e3, 0xDD);
  }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

// The 2 x 2 tile block every AMX kernel here runs: C tiles 0-3 hold a 32 x 32 fp32 block (0: top
// left, 1: top right, 2: bottom left, 3: bottom right), tiles 4-5 its top and bottom 16 rows of A,
// 6-7 its left and right B tiles.

// C += A · B for one 32-wide step of the shared dimension: A rows at a_top and a_bottom (rows
// a_stride bytes apart), B tiles at b_left and b_right (64 bytes per row).
inline void AmxStep2x2(const void* a_top, const void* a_bottom, size_t a_stride, const void* b_left,
                       const void* b_right) {
  _tile_loadd(4, a_top, a_stride);
  _tile_loadd(5, a_bottom, a_stride);
  _tile_loadd(6, b_left, 64);
  _tile_loadd(7, b_right, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

inline void AmxZero2x2() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// The 32 x 32 block at c (rows ld floats apart) into / out of C tiles 0-3.
inline void AmxLoad2x2(const float* c, size_t ld) {
  _tile_loadd(0, c, ld * 4);
  _tile_loadd(1, c + 16, ld * 4);
  _tile_loadd(2, c + 16 * ld, ld * 4);
  _tile_loadd(3, c + 16 * ld + 16, ld * 4);
}
inline void AmxStore2x2(float* c, size_t ld) {
  _tile_stored(0, c, ld * 4);
  _tile_stored(1, c + 16, ld * 4);
  _tile_stored(2, c + 16 * ld, ld * 4);
  _tile_stored(3, c + 16 * ld + 16, ld * 4);
}

#pragma GCC pop_options

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
#endif
