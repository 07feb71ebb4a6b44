// Liveness between ranks that does not wait on MPI: every rank sends a UDP datagram to the next
// rank each half second, and a rank that hears nothing from the previous one ends the job.
#pragma once

#include <mpi.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::distributed {

class Watchdog;

// A node that dies or loses its link leaves its peers inside a collective whose TCP connection
// just stops: MPI reports nothing. The ranks form a ring (rank r sends to r + 1); a rank whose
// predecessor stays silent for `silence_s` seconds has the watchdog end the job (exit code 3),
// naming that rank and its host, so a lost node ends the job in about `silence_s` whatever
// distributed.timeout_s is; a rank that ends the job tells every rank so directly. A rank leaving cleanly says goodbye, and a process that was itself
// suspended (SIGSTOP, `scontrol suspend`) starts counting again when it resumes.
//
// Collective over `world`. When datagrams do not arrive at start (UDP blocked between nodes),
// the heartbeat turns itself off on every rank and warning() says so: lost nodes are then found
// by the watchdog's timeout only.
class Heartbeat {
 public:
  Heartbeat(MPI_Comm world, const std::string& hostname, double silence_s, Watchdog& dog);
  ~Heartbeat();  // stops the thread and says goodbye to the next rank
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool active() const { return active_; }
  const std::string& warning() const { return warning_; }

  // Tells every rank that this one is ending the job, so that each ends itself (exit code 3)
  // even where MPI_Abort cannot reach it (a launcher cut off from a node). Called by
  // ProcessContext::abort_job from any thread; does nothing without an active heartbeat.
  static void tell_everyone_the_job_ends();

 private:
  void run();
  void send(const std::vector<sockaddr_in>& to, uint32_t kind, uint32_t about);
  void receive(std::chrono::steady_clock::time_point now);
  void set_failure(const std::string& message);

  int socket_ = -1;
  int rank_ = 0;
  int previous_ = 0;  // the rank this one watches
  std::string previous_host_;
  std::vector<std::vector<sockaddr_in>> everyone_;  // each rank's addresses
  int next_ = 0;                   // the rank this one sends its beats to
  uint64_t token_ = 0;             // the job's, so that no other job's datagrams count
  std::chrono::duration<double> silence_;
  std::atomic<bool> active_{false};  // set after the start-up handshake
  std::string warning_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> heard_{false};      // a datagram from the previous rank has arrived
  std::atomic<bool> previous_left_{false};
  std::atomic<uint32_t> silent_rank_{0xffffffff};  // the previous rank once found silent
  std::chrono::steady_clock::time_point last_heard_;  // the thread's own
  std::mutex failure_mutex_;
  std::string failure_;  // set once by the thread; read by the watchdog's health check
  Watchdog* dog_ = nullptr;
  uint64_t hooks_ = 0;
  std::thread thread_;
};

}  // namespace tessera::distributed
