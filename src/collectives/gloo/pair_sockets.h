// The TCP sockets under a gloo context's pairs, and their send buffers.
//
// Gloo's class-based algorithms (halving_doubling, ring_chunked) send through its TCP Pair::send,
// which sets SO_SNDBUF to the largest message the pair has sent so far. Setting SO_SNDBUF turns
// the kernel's autotuning off for good: after halving-doubling allreduces of 4 to 64 KB a pair's
// send buffer stayed at 64 KB, and allreduces of 256 KB to 16 MB through gloo's option-based
// algorithms on the same pairs then stalled 40 ms at a time on delayed acknowledgements (48-310
// ms instead of 0.3-13 ms; 2 ranks over loopback TCP, bench/allreduce_bench.sh). So after a
// class-based algorithm's first run the pairs' send buffers go back up to what autotuning would
// reach. Gloo keeps a pair's socket to itself: a context's sockets are found as those the
// process had after connecting it and not before (a socket another thread opened meanwhile is
// widened too, which does it no harm).
#pragma once

#include <set>
#include <vector>

namespace dtrain::collectives {

// The file descriptors of this process's sockets.
std::set<int> OpenSockets();

// The connected TCP sockets open now that were not in `before`.
std::vector<int> NewTcpSockets(const std::set<int>& before);

// Raises each socket's send buffer to the kernel's autotuning maximum (net.ipv4.tcp_wmem's third
// value) where it is below; a socket that is gone is skipped.
void WidenSendBuffers(const std::vector<int>& sockets);

}  // namespace dtrain::collectives
