// The bare copy that any sampler of stacked-frame windows does (benchmarks/replay_pixels.py's
// floor): `batch` windows of `span` bytes from rows of a frame table into one output, with no
// draw, no metadata, no Python, as fast as this host allows: 8 windows a 64-byte line each in
// turn (one core keeps more reads in flight over several streams; 8 beat 4 and one memcpy per
// window on the Zen 4 EPYC, session 54), and on 2 threads the second one spin-waits between
// batches (no wake-up in the timed part).
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace {
constexpr long LINE = 64;
constexpr int AT_ONCE = 8;

void copy_windows(const unsigned char *table, long width, long span, const long *rows, unsigned char *out, int lo,
                  int hi) {
  int i = lo;
  for (; i + AT_ONCE <= hi; i += AT_ONCE) {
    const unsigned char *src[AT_ONCE];
    unsigned char *dst[AT_ONCE];
    for (int w = 0; w < AT_ONCE; w++) {
      src[w] = table + rows[i + w] * width;
      dst[w] = out + long(i + w) * span;
    }
    long o = 0;
    for (; o + LINE <= span; o += LINE)
      for (int w = 0; w < AT_ONCE; w++) std::memcpy(dst[w] + o, src[w] + o, LINE);
    for (int w = 0; w < AT_ONCE; w++) std::memcpy(dst[w] + o, src[w] + o, span - o);
  }
  for (; i < hi; i++) std::memcpy(out + long(i) * span, table + rows[i] * width, span);
}
}  // namespace

// `calls` batches, batch c's window c * batch + i starting at row rows[c * batch + i]; each
// batch's wall time in microseconds into us[c].
extern "C" void time_window_copies(const unsigned char *table, long width, long span, const long *rows, int calls,
                                   int batch, unsigned char *out, int threads, double *us) {
  std::atomic<long> posted{0}, done{0};
  const int half = (batch + 1) / 2;
  std::thread helper;
  if (threads == 2)
    helper = std::thread([&] {
      for (long seen = 0;;) {
        long c;
        while ((c = posted.load(std::memory_order_acquire)) == seen) {
        }
        if (c < 0) return;
        seen = c;
        copy_windows(table, width, span, rows + (c - 1) * batch, out, half, batch);
        done.store(c, std::memory_order_release);
      }
    });
  for (int c = 0; c < calls; c++) {
    const auto start = std::chrono::steady_clock::now();
    if (threads == 2) {
      posted.store(c + 1, std::memory_order_release);
      copy_windows(table, width, span, rows + long(c) * batch, out, 0, half);
      while (done.load(std::memory_order_acquire) != c + 1) {
      }
    } else {
      copy_windows(table, width, span, rows + long(c) * batch, out, 0, batch);
    }
    us[c] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  if (threads == 2) {
    posted.store(-1, std::memory_order_release);
    helper.join();
  }
}
