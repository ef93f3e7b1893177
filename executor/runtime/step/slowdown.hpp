// An emulated slower device (--slowdown F, CPU ranks): every kernel this rank
// runs takes F times as long as it did, the rest spent asleep, so that the
// core goes to the other ranks as it would with a slower device beside them.
// For experiments with mixed meshes where there is one kind of device (a CPU
// stage beside a GPU one, a throttled rank) and for the tests of the
// device-aware partition. Short debts are gathered until they are worth a
// sleep, so kernels of microseconds are stretched too.
#pragma once

#include <chrono>
#include <thread>

namespace tiermem::exec {

class Slowdown {
 public:
  explicit Slowdown(double factor) : m_factor(factor) {}
  bool active() const { return m_factor > 1; }
  double factor() const { return m_factor; }

  // Owes (factor - 1) x `took`; sleeps once 200 us are owed.
  void stretch(std::chrono::nanoseconds took) {
    if (!active()) return;
    m_owed += std::chrono::duration<double>(took).count() * (m_factor - 1);
    if (m_owed < 200e-6) return;
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(m_owed));
    m_owed -= std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Stretches the scope it lives in (unless `on` is false).
  class Scope {
   public:
    explicit Scope(Slowdown& s, bool on = true) : m_s(s), m_on(on), m_begin(std::chrono::steady_clock::now()) {}
    ~Scope() {
      if (m_on) m_s.stretch(std::chrono::steady_clock::now() - m_begin);
    }

   private:
    Slowdown& m_s;
    bool m_on;
    std::chrono::steady_clock::time_point m_begin;
  };

 private:
  double m_factor;
  double m_owed = 0;  // seconds still to sleep (negative: slept ahead)
};

}  // namespace tiermem::exec
