// DeviceGraph::topology(): the captured graph of one device read back as nodes and edges
// (cudaGraphGetNodes / cudaGraphGetEdges), with the roles recorded during capture.
#include <cuda_runtime_api.h>

#include <map>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"

namespace distgemm::device {

namespace {

const char* node_kind(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeWaitEvent:
      return "event_wait";
    case cudaGraphNodeTypeEventRecord:
      return "event_record";
    default:
      return "other";
  }
}

}  // namespace

GraphTopology DeviceGraph::topology() const {
  GraphTopology topo;
  if (!graph_) return topo;
  size_t num_nodes = 0;
  DISTGEMM_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &num_nodes));
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  if (num_nodes > 0) DISTGEMM_CUDA_CHECK(cudaGraphGetNodes(graph_, nodes.data(), &num_nodes));
  std::map<cudaGraphNode_t, const GraphNode*> role_of;
  for (const auto& [node, role] : roles_) role_of[node] = &role;
  std::map<cudaGraphNode_t, int> index_of;
  for (size_t i = 0; i < num_nodes; ++i) {
    index_of[nodes[i]] = static_cast<int>(i);
    const auto r = role_of.find(nodes[i]);
    GraphNode n = r != role_of.end() ? *r->second : GraphNode{};
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    DISTGEMM_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    n.kind = node_kind(type);
    topo.nodes.push_back(n);
  }

  size_t num_edges = 0;
#if CUDART_VERSION >= 13000
  DISTGEMM_CUDA_CHECK(cudaGraphGetEdges(graph_, nullptr, nullptr, nullptr, &num_edges));
#else
  DISTGEMM_CUDA_CHECK(cudaGraphGetEdges_v2(graph_, nullptr, nullptr, nullptr, &num_edges));
#endif
  std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
  std::vector<cudaGraphEdgeData> data(num_edges);
  if (num_edges > 0) {
#if CUDART_VERSION >= 13000
    DISTGEMM_CUDA_CHECK(cudaGraphGetEdges(graph_, from.data(), to.data(), data.data(), &num_edges));
#else
    DISTGEMM_CUDA_CHECK(
        cudaGraphGetEdges_v2(graph_, from.data(), to.data(), data.data(), &num_edges));
#endif
  }
  for (size_t j = 0; j < num_edges; ++j) {
    GraphEdge e;
    e.from = index_of.at(from[j]);
    e.to = index_of.at(to[j]);
    e.programmatic = data[j].type == cudaGraphDependencyTypeProgrammatic;
    topo.edges.push_back(e);
  }
  return topo;
}

}  // namespace distgemm::device
