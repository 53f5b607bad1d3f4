// distgemm_bench --graph-json: DeviceGraph::topology() of every device and the plan ops it was
// built from, written as JSON (the layout is read by tests/gpu/graph_checks.py).
//
//   {"schedule", "tp", "steps", "partial_via",
//    "devices": [{"rank", "stats": {...GraphStats},
//                 "nodes": [{"kind", "role", "gemm", "copy", "peer", "flag", "waits"}],
//                 "edges": [{"from", "to", "programmatic"}],
//                 "gemms": [{"iteration", "waits", "signals", "a", "b", "partial", "d", "elems"}],
//                 "copies": [{"src", "dst", "elems", "after_gemm", "waits", "signals"}]}]}
//   A buffer reference is {"buffer", "device", "offset"} (elements) or null; a signal [rank, flag].
#include "graph_json.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace distgemm::bench {

namespace {

std::string ints(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string flags(const std::vector<schedule::FlagRef>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(v[i].device) + ", " + std::to_string(v[i].flag) + "]";
  return s + "]";
}

std::string ref(const schedule::BufRef& r) {
  if (!r.valid()) return "null";
  return std::string("{\"buffer\": \"") + schedule::buffer_name(r.buffer) +
         "\", \"device\": " + std::to_string(r.device) +
         ", \"offset\": " + std::to_string(r.offset) + "}";
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

void write_graph_json(const std::string& path, const Setup& s) {
  std::ostringstream o;
  const schedule::Plan& plan = s.plan;
  o << "{\"schedule\": " << quoted(plan.schedule) << ", \"tp\": " << plan.tp
    << ", \"steps\": " << plan.steps
    << ", \"partial_via\": " << quoted(schedule::partial_via_name(plan.partial_via))
    << ", \"devices\": [";
  for (size_t d = 0; d < s.graphs.size(); ++d) {
    const device::DeviceGraph& g = *s.graphs[d];
    const device::GraphStats& st = g.stats();
    const device::GraphTopology topo = g.topology();
    const schedule::DeviceProgram& prog = plan.devices[g.rank()];
    o << (d ? ", " : "") << "\n  {\"rank\": " << g.rank()
      << ", \"stats\": {\"gemm_nodes\": " << st.gemm_nodes << ", \"copy_nodes\": " << st.copy_nodes
      << ", \"signal_nodes\": " << st.signal_nodes << ", \"wait_kernels\": " << st.wait_kernels
      << ", \"pdl\": " << (st.pdl ? "true" : "false") << ", \"gemm_n128\": " << st.gemm_n128
      << "},\n   \"nodes\": [";
    for (size_t i = 0; i < topo.nodes.size(); ++i) {
      const device::GraphNode& n = topo.nodes[i];
      o << (i ? ", " : "") << "\n    {\"kind\": " << quoted(n.kind)
        << ", \"role\": " << quoted(n.role) << ", \"gemm\": " << n.gemm << ", \"copy\": " << n.copy
        << ", \"peer\": " << n.peer << ", \"flag\": " << n.flag << ", \"waits\": " << ints(n.waits)
        << "}";
    }
    o << "],\n   \"edges\": [";
    for (size_t i = 0; i < topo.edges.size(); ++i) {
      const device::GraphEdge& e = topo.edges[i];
      o << (i ? ", " : "") << "{\"from\": " << e.from << ", \"to\": " << e.to
        << ", \"programmatic\": " << (e.programmatic ? "true" : "false") << "}";
    }
    o << "],\n   \"gemms\": [";
    for (size_t i = 0; i < prog.gemms.size(); ++i) {
      const schedule::GemmOp& op = prog.gemms[i];
      o << (i ? ", " : "") << "\n    {\"iteration\": " << op.iteration
        << ", \"waits\": " << ints(op.waits) << ", \"signals\": " << flags(op.signals)
        << ", \"a\": " << ref(op.a) << ", \"b\": " << ref(op.b)
        << ", \"partial\": " << ref(op.partial) << ", \"d\": " << ref(op.d)
        << ", \"elems\": " << plan.problem.l * op.m * op.n << "}";
    }
    o << "],\n   \"copies\": [";
    for (size_t i = 0; i < prog.copies.size(); ++i) {
      const schedule::CopyOp& cp = prog.copies[i];
      o << (i ? ", " : "") << "\n    {\"src\": " << ref(cp.src) << ", \"dst\": " << ref(cp.dst)
        << ", \"elems\": " << plan.problem.l * cp.rows * cp.cols
        << ", \"after_gemm\": " << cp.after_gemm << ", \"waits\": " << ints(cp.waits)
        << ", \"signals\": " << flags(cp.signals) << "}";
    }
    o << "]}";
  }
  o << "\n]}\n";
  std::ofstream f(path);
  if (!f || !(f << o.str())) throw std::runtime_error("cannot write --graph-json " + path);
}

}  // namespace distgemm::bench
