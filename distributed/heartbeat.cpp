// The heartbeat ring: a UDP socket per rank, a thread that sends to the next rank and listens
// for the previous one, and the watchdog health check that ends the job when it falls silent.
#include "distributed/heartbeat.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>

#include "distributed/errors.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// Beats twice a second: a peer needs dozens of lost datagrams in a row to be taken for dead.
constexpr std::chrono::milliseconds kInterval{500};
// The thread wakes at least this often to send and to look at the silence.
constexpr int kPollMs = 100;
// A gap this long between the thread's own wake-ups means this process was suspended (SIGSTOP,
// `scontrol suspend`, a debugger): the silence is counted again from the resume.
constexpr std::chrono::seconds kSuspendedGap{2};
// How long start-up waits for the first datagram from the previous rank before deciding that UDP
// does not get through (firewalled nodes): the ranks are within milliseconds of each other here,
// right after an allgather.
constexpr std::chrono::seconds kHandshake{5};
constexpr int kMaxAddresses = 8;  // a node's IPv4 addresses offered to its peers
constexpr uint32_t kMagic = 0x42485354;  // "TSHB"
constexpr uint32_t kBeat = 1;
constexpr uint32_t kBye = 2;
constexpr uint32_t kJobEnds = 3;
constexpr uint32_t kNobody = 0xffffffff;  // Datagram::about when it is about no rank

// The active heartbeat of this process, for abort_job's broadcast.
std::atomic<Heartbeat*> active_instance{nullptr};

// What each rank tells the others at start, gathered as bytes.
struct Card {
  uint32_t port = 0;   // network order
  uint32_t count = 0;  // addresses in use
  uint32_t addresses[kMaxAddresses] = {};  // network order
  int32_t node = 0;    // the lowest world rank on this rank's node: same node, same value
  char host[64] = {};
};

struct Datagram {
  uint32_t magic;
  uint32_t kind;
  uint32_t sender;
  uint32_t about;  // kJobEnds: the rank found silent, or kNobody
  uint64_t token;
};

std::vector<uint32_t> interface_addresses() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr && static_cast<int>(out.size()) < kMaxAddresses; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    out.push_back(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
  }
  freeifaddrs(list);
  return out;
}

sockaddr_in address(uint32_t ip, uint32_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip;
  a.sin_port = static_cast<in_port_t>(port);
  return a;
}

}  // namespace

Heartbeat::Heartbeat(MPI_Comm world, const std::string& hostname, double silence_s, Watchdog& dog)
    : silence_(silence_s), dog_(&dog) {
  int size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &size));
  if (size < 2 || silence_s <= 0) return;

  Card mine;
  socket_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in bound = address(htonl(INADDR_ANY), 0);
  socklen_t length = sizeof(bound);
  if (socket_ >= 0 && ::bind(socket_, reinterpret_cast<sockaddr*>(&bound), sizeof(bound)) == 0 &&
      ::getsockname(socket_, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
    mine.port = bound.sin_port;
    const std::vector<uint32_t> ips = interface_addresses();
    mine.count = static_cast<uint32_t>(ips.size());
    std::copy(ips.begin(), ips.end(), mine.addresses);
  }
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Allreduce(&rank_, &mine.node, 1, MPI_INT32_T, MPI_MIN, node));
  MPI_CHECK(MPI_Comm_free(&node));
  std::strncpy(mine.host, hostname.c_str(), sizeof(mine.host) - 1);
  std::vector<Card> cards(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&mine, sizeof(Card), MPI_BYTE, cards.data(), sizeof(Card), MPI_BYTE, world));
  if (rank_ == 0) token_ = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  MPI_CHECK(MPI_Bcast(&token_, 1, MPI_UINT64_T, 0, world));

  previous_ = (rank_ + size - 1) % size;
  next_ = (rank_ + 1) % size;
  previous_host_ = cards[static_cast<size_t>(previous_)].host;
  everyone_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const Card& card = cards[static_cast<size_t>(r)];
    if (card.port == 0 || r == rank_) continue;
    auto& to = everyone_[static_cast<size_t>(r)];
    for (uint32_t i = 0; i < card.count; ++i) to.push_back(address(card.addresses[i], card.port));
    if (card.node == mine.node) to.push_back(address(htonl(INADDR_LOOPBACK), card.port));
  }

  last_heard_ = Clock::now();
  if (socket_ >= 0 && mine.port != 0) thread_ = std::thread([this] { run(); });
  const auto until = Clock::now() + kHandshake;
  while (thread_.joinable() && !heard_ && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int heard = heard_ ? 1 : 0;
  std::vector<int> everyone(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&heard, 1, MPI_INT, everyone.data(), 1, MPI_INT, world));
  std::ostringstream deaf;
  for (int r = 0; r < size; ++r)
    if (everyone[static_cast<size_t>(r)] == 0) deaf << (deaf.tellp() > 0 ? ", " : "") << r;
  if (deaf.tellp() == 0) {
    active_ = true;
    hooks_ = dog.add_hooks(
        [this] {
          std::lock_guard<std::mutex> lock(failure_mutex_);
          return failure_;
        },
        nullptr);
    active_instance = this;
    return;
  }
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  std::ostringstream out;
  out << "heartbeat off: rank(s) " << deaf.str() << " heard no UDP datagram from the previous rank within "
      << kHandshake.count() << " s (UDP blocked between nodes?); a lost node now ends the job only "
      << "after distributed.timeout_s";
  warning_ = out.str();
}

Heartbeat::~Heartbeat() {
  Heartbeat* self = this;
  active_instance.compare_exchange_strong(self, nullptr);
  if (hooks_ != 0) dog_->remove_hooks(hooks_);
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  // Three goodbyes: one lost datagram must not make the next rank take a clean exit for a loss.
  if (active_)
    for (int i = 0; i < 3; ++i) send(everyone_[static_cast<size_t>(next_)], kBye, kNobody);
  if (socket_ >= 0) ::close(socket_);
}

void Heartbeat::tell_everyone_the_job_ends() {
  Heartbeat* self = active_instance.load();
  if (self == nullptr) return;
  for (int i = 0; i < 3; ++i)
    for (const auto& to : self->everyone_) self->send(to, kJobEnds, self->silent_rank_);
}

void Heartbeat::send(const std::vector<sockaddr_in>& to, uint32_t kind, uint32_t about) {
  const Datagram d{kMagic, kind, static_cast<uint32_t>(rank_), about, token_};
  // Errors are expected while a link is down; the receiving side decides what silence means.
  for (const sockaddr_in& a : to)
    ::sendto(socket_, &d, sizeof(d), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
}

void Heartbeat::set_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failure_.empty()) failure_ = message;
}

void Heartbeat::receive(Clock::time_point now) {
  Datagram d{};
  for (;;) {
    const ssize_t got = ::recv(socket_, &d, sizeof(d), 0);
    if (got < 0) return;  // EAGAIN: nothing more for now
    if (got != static_cast<ssize_t>(sizeof(d)) || d.magic != kMagic || d.token != token_) continue;
    if (d.kind == kJobEnds && active_) {
      std::ostringstream out;
      out << "rank " << d.sender << " is ending the job";
      if (d.about != kNobody) out << " (rank " << d.about << " sent it no heartbeat)";
      out << "; its log says why";
      set_failure(out.str());
      continue;
    }
    if (d.sender != static_cast<uint32_t>(previous_)) continue;
    if (d.kind == kBeat) {
      last_heard_ = now;
      heard_ = true;
    } else if (d.kind == kBye) {
      previous_left_ = true;
    }
  }
}

void Heartbeat::run() {
  Clock::time_point last_wake = Clock::now();
  Clock::time_point next_send = last_wake;
  // Shorter than the silence, so that a suspension that outlasts it is always seen.
  const auto suspended_gap = std::min<std::chrono::duration<double>>(kSuspendedGap, silence_ / 2);
  while (!stopping_) {
    pollfd p{socket_, POLLIN, 0};
    ::poll(&p, 1, kPollMs);
    const Clock::time_point now = Clock::now();
    if (now - last_wake > suspended_gap) last_heard_ = now;
    last_wake = now;
    receive(now);
    if (now >= next_send) {
      send(everyone_[static_cast<size_t>(next_)], kBeat, kNobody);
      next_send = now + kInterval;
    }
    if (active_ && !previous_left_ && now - last_heard_ > silence_) {
      std::ostringstream out;
      out << "rank " << previous_ << " on " << previous_host_ << " sent no heartbeat for "
          << silence_.count() << " s (distributed.heartbeat_s): its process, its node or the link "
          << "to it is lost";
      silent_rank_ = static_cast<uint32_t>(previous_);
      set_failure(out.str());
    }
  }
}

}  // namespace tessera::distributed
