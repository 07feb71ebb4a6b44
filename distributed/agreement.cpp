// Agreement checks over MPI: min and max of a value across ranks must be equal.
#include "distributed/agreement.h"

#include <cstring>
#include <sstream>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {

uint64_t fingerprint(const std::string& text) {
  constexpr uint64_t kOffset = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis
  constexpr uint64_t kPrime = 0x100000001b3ull;         // FNV-1a 64-bit prime
  uint64_t hash = kOffset;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= kPrime;
  }
  return hash;
}

void check_same_on_all_ranks(ProcessContext& context, uint64_t value, const std::string& what) {
  uint64_t extremes[2] = {value, ~value};  // min of value and min of ~value (= ~max)
  {
    Watchdog::Scope watch(context.watchdog(), "agreement check: " + what);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MIN, context.world()));
  }
  const uint64_t low = extremes[0], high = ~extremes[1];
  if (low != high) {
    std::ostringstream out;
    out << "ranks disagree on " << what << ": values range from " << std::hex << low << " to "
        << high << " (this rank: " << value << ")";
    throw UserError(out.str());
  }
}

void check_same_on_all_ranks(ProcessContext& context, double value, const std::string& what) {
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(value));
  std::memcpy(&bits, &value, sizeof(bits));
  check_same_on_all_ranks(context, bits, what);
}

void broadcast_string(ProcessContext& context, std::string& text, int root) {
  long long length = static_cast<long long>(text.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_LONG_LONG, root, context.world()));
  text.resize(static_cast<size_t>(length));
  if (length > 0)
    MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, context.world()));
}

std::vector<std::string> gather_strings(ProcessContext& context, const std::string& text, int root) {
  const int size = context.size();
  const bool is_root = context.rank() == root;
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(is_root ? size : 0), offsets(is_root ? size : 0);
  MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, context.world()));
  std::string all;
  if (is_root) {
    long long total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[r] = static_cast<int>(total);
      total += lengths[r];
    }
    all.resize(static_cast<size_t>(total));
  }
  MPI_CHECK(MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                        MPI_CHAR, root, context.world()));
  std::vector<std::string> out;
  for (int r = 0; is_root && r < size; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

Failure agree_on_failure(ProcessContext& context, const std::string& local, const std::string& what) {
  Watchdog::Scope watch(context.watchdog(), what);
  int first = local.empty() ? context.size() : context.rank();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, context.world()));
  if (first == context.size()) return {};
  std::string message = context.rank() == first ? local : std::string();
  broadcast_string(context, message, first);
  return {first, message};
}

}  // namespace tessera::distributed
