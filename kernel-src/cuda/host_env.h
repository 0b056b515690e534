// WINATTN_* environment knobs of the CUDA planner and launchers (tuning overrides and A/B switches), read through a
// per-thread cache that stays valid while the process environment is unchanged.
//
// Why: getenv scans the whole environment with a string compare per entry, and one Swin forward read 3-6 knobs
// (twice, when the plan was made for the workspace size and again for the launch), inside a host path whose target
// is 50 us per call. Caching them once per process would be wrong: tests and benchmarks flip the knobs at run time
// (monkeypatch.setenv / os.environ in tests/gpu, e.g. WINATTN_SM90=0 to run v1 on Hopper, WINATTN_FWD_G), and every
// call must see the current value. So the cache keeps a snapshot of `environ`'s entry pointers and compares it on
// each read (one pointer compare per variable, no string compares): setenv / putenv / unsetenv, which os.environ
// and monkeypatch go through, always store a new entry pointer, or resize the array, when a value changes (glibc
// copies every value set by setenv; CPython >= 3.9 implements os.putenv with setenv), and any difference drops the
// cached values and bumps env_generation(). Not seen: a C caller that putenv()s its own buffer and later edits the
// characters in place; no part of this project or of torch does.
#pragma once
#include <unistd.h>  // environ

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace winattn {
namespace cuda {
namespace host_env {

struct Entry {
  const char* name;  // the caller's literal
  bool set;          // present and non-empty
  int value;         // std::atoi of it
  char first;        // its first character
  std::string text;  // the value
};

struct Cache {
  std::vector<char*> snapshot;
  std::vector<Entry> entries;
  uint64_t generation = 0;
};

inline Cache& cache() {
  thread_local Cache c;  // per thread: no lock, and no thread sees another's half-built snapshot
  return c;
}

// The cache, refreshed (entries dropped, generation bumped) if the environment differs from the snapshot.
inline Cache& current() {
  Cache& c = cache();
  char** env = environ;
  size_t n = 0;
  bool same = env != nullptr || c.snapshot.empty();
  if (env != nullptr) {
    for (; env[n] != nullptr; ++n) {
      if (n >= c.snapshot.size() || c.snapshot[n] != env[n]) {
        same = false;
        break;
      }
    }
    if (same && n != c.snapshot.size()) same = false;
  }
  if (!same || c.generation == 0) {
    c.snapshot.clear();
    if (env != nullptr)
      for (char** e = env; *e != nullptr; ++e) c.snapshot.push_back(*e);
    c.entries.clear();
    ++c.generation;
  }
  return c;
}

inline const Entry& lookup(const char* name) {
  Cache& c = current();
  for (const Entry& e : c.entries)
    if (e.name == name || std::strcmp(e.name, name) == 0) return e;
  const char* v = std::getenv(name);
  const bool set = v != nullptr && *v != '\0';
  c.entries.push_back(Entry{name, set, set ? std::atoi(v) : 0, set ? v[0] : '\0', set ? std::string(v) : std::string()});
  return c.entries.back();
}

}  // namespace host_env

// std::atoi of the variable, or `fallback` when it is unset or empty (the semantics of the per-call getenv reads
// this replaces).
inline int env_int(const char* name, int fallback) {
  const host_env::Entry& e = host_env::lookup(name);
  return e.set ? e.value : fallback;
}

// true iff the variable starts with '1'; `fallback` when it is unset or empty.
inline bool env_flag(const char* name, bool fallback) {
  const host_env::Entry& e = host_env::lookup(name);
  return e.set ? e.first == '1' : fallback;
}

// The variable's text ("" when unset).
inline std::string env_str(const char* name) { return host_env::lookup(name).text; }

// Changes whenever this thread sees the environment change: part of the key of anything planned from the knobs.
inline uint64_t env_generation() { return host_env::current().generation; }

}  // namespace cuda
}  // namespace winattn
