// Shared definitions for PEARL's HLS kernels.
//
// Vitis HLS (csim and csynth) provides <hls_stream.h>. Without Vitis (the g++ C-simulation the
// test suite runs), a minimal FIFO with the same read/write/empty interface stands in for
// hls::stream: dataflow stages then run one after the other, each draining its input FIFO,
// which is also how Vitis C-simulation executes a DATAFLOW region.
#ifndef PEARL_HLS_H
#define PEARL_HLS_H

#include <stdint.h>

#if defined(__SYNTHESIS__) || defined(PEARL_USE_VITIS_HEADERS)
#include <hls_stream.h>
#else
#include <deque>
#include <stdexcept>
namespace hls {
template <typename T>
class stream {
  public:
    stream() {}
    explicit stream(const char *) {}
    void write(const T &value) { fifo_.push_back(value); }
    T read() {
        if (fifo_.empty()) throw std::runtime_error("hls::stream read from an empty FIFO");
        T value = fifo_.front();
        fifo_.pop_front();
        return value;
    }
    bool empty() const { return fifo_.empty(); }
    std::size_t size() const { return fifo_.size(); }

  private:
    std::deque<T> fifo_;
};
}  // namespace hls
#endif

namespace pearl {

constexpr long ipow(long base, int exponent) { return exponent == 0 ? 1 : base * ipow(base, exponent - 1); }

// numpy's pairwise_sum (numpy/_core/src/umath/loops_utils.h.src) of c[0..K) for K <= 128: below
// 8 elements a plain loop, otherwise 8 running partial sums combined as
// ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) plus the remainder. Summing a node's children in exactly
// this association makes a float64 tree bit-identical to the numpy reference
// (kernels/cpu/sumtree.py, `.sum(axis=1)`). In hardware it is a fixed adder tree of depth
// K/8 + 3 (K >= 8): the association is free.
template <typename R, int K>
inline R pairwise_sum(const R c[K]) {
#pragma HLS INLINE
    static_assert(K >= 1 && K <= 128, "pairwise_sum: fanout must be in [1, 128]");
    if (K < 8) {
        R res = R(-0.0);  // numpy starts from -0.0; same result for non-negative sums
        for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
            res += c[j];
        }
        return res;
    }
    R r[8];
#pragma HLS ARRAY_PARTITION variable = r complete
    for (int j = 0; j < 8; ++j) {
#pragma HLS UNROLL
        r[j] = c[j];
    }
    const int full = K - K % 8;
    for (int i = 8; i < full; i += 8) {
#pragma HLS UNROLL
        for (int j = 0; j < 8; ++j) {
#pragma HLS UNROLL
            r[j] += c[i + j];
        }
    }
    R res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (int i = full; i < K; ++i) {
#pragma HLS UNROLL
        res += c[i];
    }
    return res;
}

}  // namespace pearl

#endif
