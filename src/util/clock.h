/* clock.h — the one monotonic clock for timings (phase times, throughput, timeouts).
 *
 * Invariant: CLOCK_MONOTONIC, so an NTP step or a change of the wall clock never makes a
 * measured interval negative; only differences of two readings mean anything. */
#ifndef K3_CLOCK_H
#define K3_CLOCK_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC), with nanosecond resolution. */
double k3_now_s(void);

#endif
