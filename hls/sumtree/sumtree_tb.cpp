// C-simulation testbench of `pearl_sumtree` (the csim step of hls/Makefile, and run by
// tests/test_hls_sumtree.py). Drives the kernel top exactly as the host driver does and checks it
// against a float64 model: cumulative sums + binary search, sequential last-write-wins updates.
// Exit status 0 when every check passes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sumtree_config.h"

extern "C" void pearl_sumtree(int op, int n, const long long *indices, const double *values,
                              long long *out_indices, double *out_values);

using pearl::sumtree::OP_CLEAR;
using pearl::sumtree::OP_FIND;
using pearl::sumtree::OP_GET;
using pearl::sumtree::OP_ROOT;
using pearl::sumtree::OP_SAMPLE;
using pearl::sumtree::OP_UPDATE;

static unsigned long long rng_state = 0x9E3779B97F4A7C15ULL;
static double uniform() {  // xorshift64*, deterministic across compilers
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return double((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static int failures = 0;
static void check(bool ok, const char *what, long detail) {
    if (!ok) {
        if (failures < 10) std::printf("FAIL %s (%ld)\n", what, detail);
        ++failures;
    }
}

// Leaf j with c[j-1] <= prefix < c[j]; `gap` = distance to the nearest bracket boundary.
static long model_find(const std::vector<double> &cum, double prefix, double &gap) {
    long lo = 0, hi = (long)cum.size();
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (cum[mid] <= prefix) lo = mid + 1; else hi = mid;
    }
    const double below = lo > 0 ? cum[lo - 1] : 0.0;
    const double above = lo < (long)cum.size() ? cum[lo] : cum.back();
    gap = std::fmin(std::fabs(prefix - below), std::fabs(above - prefix));
    return lo;
}

int main() {
    const long capacity = std::min(100000L, (long)SumTreeConfig::leaves);
    const int batch = 256;
    // float32 nodes: prefixes within this fraction of the total from a boundary may land on the
    // neighbouring leaf (measured here: mismatches only within 3e-8 of the total; hls/README.md)
    const bool fp64 = sizeof(sumtree_real) == 8;
    const double tolerance = fp64 ? 1e-9 : 1e-6;
    const double total_tolerance = fp64 ? 1e-12 : 1e-5;
    std::vector<double> priorities(capacity), out_values(PEARL_SUMTREE_MAX_BATCH);
    std::vector<long long> indices(PEARL_SUMTREE_MAX_BATCH), out_indices(PEARL_SUMTREE_MAX_BATCH);
    std::vector<double> values(PEARL_SUMTREE_MAX_BATCH);

    pearl_sumtree(OP_CLEAR, 0, 0, 0, 0, 0);
    pearl_sumtree(OP_ROOT, 0, 0, 0, 0, out_values.data());
    check(out_values[0] == 0.0 && std::isinf(out_values[1]), "empty tree: total 0, min inf", 0);

    // fill every leaf, a fifth of them with zero priority, in chunks of the kernel's batch
    for (long start = 0; start < capacity; start += PEARL_SUMTREE_MAX_BATCH) {
        int n = (int)std::min<long>(PEARL_SUMTREE_MAX_BATCH, capacity - start);
        for (int i = 0; i < n; ++i) {
            double p = uniform() < 0.2 ? 0.0 : uniform() * 10.0;
            priorities[start + i] = double(sumtree_real(p));  // what the tree can hold
            indices[i] = start + i;
            values[i] = p;
        }
        pearl_sumtree(OP_UPDATE, n, indices.data(), values.data(), out_indices.data(), out_values.data());
    }
    // duplicates in one batch: the last one wins
    indices[0] = 7; values[0] = 3.0;
    indices[1] = 7; values[1] = 0.0;
    indices[2] = 7; values[2] = 1.25;
    indices[3] = 11; values[3] = 0.0;
    pearl_sumtree(OP_UPDATE, 4, indices.data(), values.data(), out_indices.data(), out_values.data());
    priorities[7] = 1.25;
    priorities[11] = 0.0;

    std::vector<double> cum(capacity);
    double running = 0.0, smallest = INFINITY;
    for (long j = 0; j < capacity; ++j) {
        running += priorities[j];
        cum[j] = running;
        if (priorities[j] > 0 && priorities[j] < smallest) smallest = priorities[j];
    }
    const double root_total = out_values[0];
    check(std::fabs(root_total - running) <= total_tolerance * running, "total", 0);
    check(out_values[1] == smallest, "min", 0);

    // get
    for (int i = 0; i < batch; ++i) indices[i] = (long long)(uniform() * capacity);
    pearl_sumtree(OP_GET, batch, indices.data(), 0, 0, out_values.data());
    for (int i = 0; i < batch; ++i) check(out_values[i] == priorities[indices[i]], "get", (long)indices[i]);

    // stratified sampling: model prefixes in float64 from the kernel's total
    long compared = 0;
    for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < batch; ++i) values[i] = uniform();
        pearl_sumtree(OP_SAMPLE, batch, 0, values.data(), out_indices.data(), out_values.data());
        for (int i = 0; i < batch; ++i) {
            const long got = (long)out_indices[i];
            check(got >= 0 && got < capacity && priorities[got] > 0.0, "sampled a live leaf", got);
            if (got < 0 || got >= capacity) continue;
            check(out_values[i] == priorities[got], "sampled priority", got);
            double gap;
            const long expected = model_find(cum, (i + values[i]) * (root_total / batch), gap);
            if (gap > tolerance * running) {
                check(got == expected, "sampled index", got);
                ++compared;
            }
        }
    }
    check(compared > 15 * batch, "most prefixes away from boundaries", compared);

    // find at exact prefixes, including 0 and just below the total
    for (int i = 0; i < batch; ++i) values[i] = uniform() * running;
    values[0] = 0.0;
    values[1] = std::nextafter(root_total, 0.0);
    pearl_sumtree(OP_FIND, batch, 0, values.data(), out_indices.data(), out_values.data());
    for (int i = 0; i < batch; ++i) {
        const long got = (long)out_indices[i];
        check(got >= 0 && got < capacity && priorities[got] > 0.0, "found a live leaf", got);
        double gap;
        const long expected = model_find(cum, values[i], gap);
        if (gap > tolerance * running) check(got == expected, "found index", got);
    }

    std::printf("sumtree csim: fanout %d, depth %d, %s nodes, %ld leaves: %s (%d failures)\n",
                PEARL_SUMTREE_FANOUT, PEARL_SUMTREE_DEPTH, sizeof(sumtree_real) == 8 ? "float64" : "float32",
                capacity, failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
