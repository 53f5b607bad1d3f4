// distgemm._core's module and its host-only core: build and inspect Plans from Python. A Plan
// crosses the boundary as an object (_core.Plan, built once per op entry and handed to the
// GraphLauncher); to_dict() gives the plain dicts/lists that the simulator, the reference executor
// and the tests (which mutate plans on purpose) work on. Tuning facts and defaults live in C++;
// Python reads them here. Every binding source of _core is in this folder (cpp/src/bindings/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <string>

#include "all.hpp"
#include "distgemm/kernel/gemm_extents.hpp"
#include "distgemm/schedule/plan.hpp"
#include "graph_setup.hpp"

namespace py = pybind11;
using namespace distgemm::schedule;

#ifdef DISTGEMM_WITH_CUDA
// Built with the CUDA runtime only: GraphLauncher, workspaces and CUDA IPC for the torch-facing API
// (runtime.cpp); one GEMM of distgemm's kernel on caller memory, for single-GPU benchmarks
// (gemm.cpp).
void register_runtime(py::module_& m);
void register_gemm(py::module_& m);
void register_fused(py::module_& m);        // fused GEMM + all-reduce launches (fused_launcher.cpp)
void register_allreduce(py::module_& m);    // one/two-shot all-reduce (allreduce_launcher.cpp)
void register_peer_memory(py::module_& m);  // IPC of caller-owned memory (peer_memory.cpp)
#endif
void register_fused_rules(py::module_& m);      // its host-only rules (fused_rules.cpp)
void register_allreduce_rules(py::module_& m);  // the all-reduce's (allreduce_rules.cpp)
void register_tile_choice(py::module_& m);      // the GEMM configuration model (tile_choice.cpp)

namespace {

py::object ref_dict(const BufRef& r) {
  if (!r.valid()) return py::none();
  py::dict d;
  d["buffer"] = buffer_name(r.buffer);
  d["device"] = r.device;
  d["offset"] = r.offset;
  d["ld"] = r.ld;
  d["batch_stride"] = r.batch_stride;
  return d;
}

py::list flags_list(const std::vector<FlagRef>& v) {
  py::list out;
  for (const FlagRef& f : v) {
    py::dict d;
    d["device"] = f.device;
    d["flag"] = f.flag;
    out.append(d);
  }
  return out;
}

py::dict def_dict(const ScheduleDef& s) {
  py::dict d;
  d["name"] = s.name;
  d["summary"] = s.summary;
  d["collective"] = collective_name(s.collective);
  d["rotating"] = operand_name(s.rotating);
  d["split"] = mode_name(s.split);
  py::dict part;
  part["a"] = mode_name(s.partition.a);
  part["b"] = mode_name(s.partition.b);
  part["d"] = mode_name(s.partition.d);
  d["partition"] = part;
  py::dict tile;
  tile["a"] = s.tile.a;
  tile["b"] = s.tile.b;
  tile["c"] = s.tile.c;
  d["tile"] = tile;
  return d;
}

Mode mode_from(const std::string& s) {
  if (s == "M") return Mode::M;
  if (s == "N") return Mode::N;
  if (s == "K") return Mode::K;
  if (s == "none") return Mode::None;
  throw std::invalid_argument("unknown mode '" + s + "': expected M, N, K or none");
}

// Custom definitions (tests corrupt coefficients) need their strings to outlive the plan.
const char* intern(const std::string& s) {
  static std::deque<std::string> store;
  for (const std::string& x : store)
    if (x == s) return x.c_str();
  store.push_back(s);
  return store.back().c_str();
}

ScheduleDef def_from(const py::dict& d) {
  ScheduleDef s;
  s.name = intern(d["name"].cast<std::string>());
  s.summary = intern(d.contains("summary") ? d["summary"].cast<std::string>() : "");
  std::string coll = d["collective"].cast<std::string>();
  if (coll == "all_gather")
    s.collective = Collective::AllGather;
  else if (coll == "reduce_scatter")
    s.collective = Collective::ReduceScatter;
  else if (coll == "all_reduce")
    s.collective = Collective::AllReduce;
  else
    throw std::invalid_argument("unknown collective '" + coll + "'");
  std::string rot = d["rotating"].cast<std::string>();
  s.rotating = rot == "A" ? Operand::A : rot == "B" ? Operand::B : Operand::C;
  s.split = mode_from(d["split"].cast<std::string>());
  py::dict part = d["partition"];
  s.partition.a = mode_from(part["a"].cast<std::string>());
  s.partition.b = mode_from(part["b"].cast<std::string>());
  s.partition.d = mode_from(part["d"].cast<std::string>());
  py::dict tile = d["tile"];
  s.tile.a = tile["a"].cast<int>();
  s.tile.b = tile["b"].cast<int>();
  s.tile.c = tile["c"].cast<int>();
  return s;
}

ScheduleDef resolve(const py::object& schedule) {
  if (py::isinstance<py::str>(schedule))
    return distgemm::schedules::find_or_throw(schedule.cast<std::string>());
  if (py::isinstance<py::dict>(schedule)) return def_from(schedule.cast<py::dict>());
  throw std::invalid_argument("schedule must be a name or a definition dict");
}

// The options of build_plan / workspace_layout: the defaults with the caller's partial transport
// (none: the default's) and row scales.
PlanOptions options_from(const ScheduleDef& def, int tp, int steps,
                         const std::optional<std::string>& partial_via, bool row_scale_a,
                         bool row_scale_b) {
  PlanOptions o = plan_options(def, tp, steps, parse_optional_partial_via(partial_via));
  o.row_scale_a = row_scale_a;
  o.row_scale_b = row_scale_b;
  return o;
}

py::dict problem_dict(const Problem& p) {
  py::dict d;
  d["m"] = p.m;
  d["n"] = p.n;
  d["k"] = p.k;
  d["l"] = p.l;
  return d;
}

// Every operand's per-device shape: {"A": (rows, cols), "B", "C", "D", "bias": elements}.
py::dict local_shapes_dict(const Plan& p) {
  const Partition& pt = p.partition();
  py::dict local;
  auto ext = [](Extent2 e) { return py::make_tuple(e.rows, e.cols); };
  local["A"] = ext(pt.local_a(p.problem, p.tp));
  local["B"] = ext(pt.local_b(p.problem, p.tp));
  local["C"] = ext(pt.local_d(p.problem, p.tp));
  local["D"] = ext(pt.local_d(p.problem, p.tp));
  local["bias"] = pt.local_bias(p.problem, p.tp);
  return local;
}

py::dict layout_dict(const WorkspaceLayout& w) {
  py::dict d;
  d["slots_offset"] = w.slots_offset;
  d["slots_bytes"] = w.slots_bytes;
  d["scale_slots_offset"] = w.scale_slots_offset;
  d["scale_slots_bytes"] = w.scale_slots_bytes;
  d["flags_offset"] = w.flags_offset;
  d["flags_bytes"] = w.flags_bytes;
  d["barrier_offset"] = w.barrier_offset;
  d["barrier_bytes"] = w.barrier_bytes;
  d["epoch_offset"] = w.epoch_offset;
  d["total_bytes"] = w.total_bytes;
  return d;
}

// The plan as plain Python data (Plan.to_dict()).
py::dict plan_dict(const Plan& p) {
  py::dict out;
  out["schedule"] = p.schedule;
  out["definition"] = def_dict(p.def);
  out["tp"] = p.tp;
  out["steps"] = p.steps;
  out["chunks_per_shard"] = p.steps / p.tp;
  out["partial_via"] = partial_via_name(p.partial_via);
  out["problem"] = problem_dict(p.problem);
  out["slot_operand"] = buffer_name(p.slot_operand);
  out["slot_elems"] = p.slot_elems;
  out["row_scale_a"] = p.row_scale_a;
  out["row_scale_b"] = p.row_scale_b;
  out["scale_slot_rows"] = p.scale_slot_rows;
  out["num_flags"] = p.num_flags;
  out["local_shapes"] = local_shapes_dict(p);
  py::list devs;
  for (const DeviceProgram& dp : p.devices) {
    py::list gemms, copies;
    for (const GemmOp& g : dp.gemms) {
      py::dict d;
      d["iteration"] = g.iteration;
      d["tile"] = g.tile;
      d["m0"] = g.m0;
      d["n0"] = g.n0;
      d["k0"] = g.k0;
      d["m"] = g.m;
      d["n"] = g.n;
      d["k"] = g.k;
      d["a"] = ref_dict(g.a);
      d["b"] = ref_dict(g.b);
      d["d"] = ref_dict(g.d);
      d["partial"] = ref_dict(g.partial);
      d["user_c"] = ref_dict(g.user_c);
      d["bias"] = ref_dict(g.bias);
      d["scale_a"] = ref_dict(g.scale_a);
      d["scale_b"] = ref_dict(g.scale_b);
      d["waits"] = py::cast(g.waits);
      d["signals"] = flags_list(g.signals);
      gemms.append(d);
    }
    for (const CopyOp& c : dp.copies) {
      py::dict d;
      d["step"] = c.step;
      d["src"] = ref_dict(c.src);
      d["dst"] = ref_dict(c.dst);
      d["rows"] = c.rows;
      d["cols"] = c.cols;
      d["scale_src"] = ref_dict(c.scale_src);
      d["scale_dst"] = ref_dict(c.scale_dst);
      d["after_gemm"] = c.after_gemm;
      d["waits"] = py::cast(c.waits);
      d["signals"] = flags_list(c.signals);
      copies.append(d);
    }
    py::dict d;
    d["gemms"] = gemms;
    d["copies"] = copies;
    devs.append(d);
  }
  out["devices"] = devs;
  return out;
}

void register_plan(py::module_& m) {
  py::class_<Plan>(m, "Plan",
                   "A built plan (schedule::Plan): built once by build_plan, read by the op "
                   "entry and handed to GraphLauncher as it is. to_dict() gives the plain dict "
                   "that the simulator, the checker and the reference executor take.")
      .def_readonly("schedule", &Plan::schedule)
      .def_property_readonly("definition", [](const Plan& p) { return def_dict(p.def); })
      .def_readonly("tp", &Plan::tp)
      .def_readonly("steps", &Plan::steps)
      .def_property_readonly("problem", [](const Plan& p) { return problem_dict(p.problem); })
      .def_property_readonly("partial_via",
                             [](const Plan& p) { return partial_via_name(p.partial_via); })
      .def_readonly("slot_elems", &Plan::slot_elems)
      .def_readonly("row_scale_a", &Plan::row_scale_a)
      .def_readonly("row_scale_b", &Plan::row_scale_b)
      .def_readonly("scale_slot_rows", &Plan::scale_slot_rows)
      .def_readonly("num_flags", &Plan::num_flags)
      .def_property_readonly("local_shapes", &local_shapes_dict,
                             "Per-device shapes: {'A', 'B', 'C', 'D': (rows, cols), 'bias': n}.")
      .def(
          "layout",
          [](const Plan& p, int slot_elem_bytes) { return layout_dict(p.layout(slot_elem_bytes)); },
          py::arg("slot_elem_bytes") = 2,
          "Byte layout of each device's symmetric workspace for this very plan.")
      .def(
          "slot_elem_bytes",
          [](const Plan& p, int operand_bytes, int out_bytes) {
            return slot_elem_bytes(p, operand_bytes, out_bytes);
          },
          py::arg("operand_bytes"), py::arg("out_bytes") = 2,
          "Bytes of one slot element: the rotating operand's (all-gather) or the output's "
          "(partials); layout() takes it.")
      .def("extent_problem", &plan_extent_problem, py::arg("device") = -1,
           py::arg("elem_bytes") = 2,
           "'' when the GEMM kernel's extent rule admits every sub-GEMM of `device` (-1: of "
           "every device), else the first reason.")
      .def_property_readonly(
          "pdl_by_default", [](const Plan& p) { return pdl_by_default(p); },
          "Whether its GEMMs chain by programmatic dependent launch by default "
          "(schedule/defaults.hpp).")
      .def("to_dict", &plan_dict, "The plan as plain Python data (dicts and lists).")
      .def("__repr__", [](const Plan& p) {
        return "Plan(" + p.schedule + ", tp=" + std::to_string(p.tp) +
               ", steps=" + std::to_string(p.steps) + ", M=" + std::to_string(p.problem.m) +
               " N=" + std::to_string(p.problem.n) + " K=" + std::to_string(p.problem.k) +
               ", partial_via=" + partial_via_name(p.partial_via) +
               (p.row_scale_a ? ", row_scale_a" : "") + (p.row_scale_b ? ", row_scale_b" : "") +
               ")";
      });

  using distgemm::python::GraphSetup;
  py::class_<GraphSetup>(m, "GraphSetup",
                         "What one rank's GraphLauncher needs besides the Plan and the user "
                         "pointers; built once per op entry.")
      .def(py::init<int, int, std::string, std::vector<uint64_t>, int64_t, double, float, float,
                    bool, int, bool, bool>(),
           py::arg("rank"), py::arg("cuda_device"), py::arg("dtype"), py::arg("workspace_bases"),
           py::arg("workspace_bytes"), py::arg("timeout_s"), py::arg("alpha") = 1.0f,
           py::arg("beta") = 0.0f, py::arg("bias") = false, py::arg("tile_n") = 0,
           py::arg("b_n_major") = false, py::arg("fast_accum") = false)
      .def_readonly("rank", &GraphSetup::rank)
      .def_readonly("cuda_device", &GraphSetup::cuda_device)
      .def_readonly("dtype", &GraphSetup::dtype)
      .def_readonly("alpha", &GraphSetup::alpha)
      .def_readonly("beta", &GraphSetup::beta)
      .def_readonly("bias", &GraphSetup::bias)
      .def_readonly("workspace_bases", &GraphSetup::workspace_bases)
      .def_readonly("workspace_bytes", &GraphSetup::workspace_bytes)
      .def_readonly("timeout_s", &GraphSetup::timeout_s)
      .def_readonly("tile_n", &GraphSetup::tile_n)
      .def_readonly("b_n_major", &GraphSetup::b_n_major)
      .def_readonly("fast_accum", &GraphSetup::fast_accum);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "distgemm core: schedules, DistributedTileScheduler and Plan (host-only)";
  m.attr("cuda_runtime") = py::bool_(
#ifdef DISTGEMM_WITH_CUDA
      true
#else
      false
#endif
  );
  m.attr("cuda_runtime_reason") = DISTGEMM_NO_CUDA_REASON;  // "" with the runtime (CMakeLists.txt)

  register_plan(m);  // before the runtime, whose GraphLauncher takes a Plan and a GraphSetup
#ifdef DISTGEMM_WITH_CUDA
  register_runtime(m);
  register_gemm(m);
  register_fused(m);
  register_allreduce(m);
  register_peer_memory(m);
#endif
  register_fused_rules(m);
  register_allreduce_rules(m);
  register_tile_choice(m);

  m.def("gemm_extent_problem", &distgemm::kernel::gemm_extent_problem, py::arg("m"), py::arg("n"),
        py::arg("k"), py::arg("l") = 1, py::arg("elem_bytes") = 2,
        "'' when the GEMM kernel's extent rule (16-byte TMA rows of A, B and D; int32 extents) "
        "admits a sub-GEMM of m x n x k, else the reason with the values and the fix");
  m.def(
      "schedules",
      []() {
        py::list out;
        for (const ScheduleDef* s : distgemm::schedules::kAll) out.append(def_dict(*s));
        return out;
      },
      "Definitions of every built-in schedule.");

  m.def(
      "schedule_definition",
      [](const std::string& name) { return def_dict(distgemm::schedules::find_or_throw(name)); },
      py::arg("name"), "The definition of one schedule, as a dict.");

  m.def(
      "validate",
      [](const py::object& schedule, int tp, int steps, int64_t m, int64_t n, int64_t k, int64_t l,
         bool row_scale_a, bool row_scale_b) {
        PlanOptions opt;
        opt.row_scale_a = row_scale_a;
        opt.row_scale_b = row_scale_b;
        return validate(resolve(schedule), Problem{m, n, k, l}, tp, steps, opt);
      },
      py::arg("schedule"), py::arg("tp"), py::arg("steps"), py::arg("m"), py::arg("n"),
      py::arg("k"), py::arg("l") = 1, py::arg("row_scale_a") = false,
      py::arg("row_scale_b") = false,
      "Empty string if the plan can be built, else the violated constraint.");

  m.def(
      "build_plan",
      [](const py::object& schedule, int tp, int steps, int64_t m, int64_t n, int64_t k, int64_t l,
         const std::optional<std::string>& partial_via, bool row_scale_a, bool row_scale_b) {
        ScheduleDef def = resolve(schedule);
        const PlanOptions opt = options_from(def, tp, steps, partial_via, row_scale_a, row_scale_b);
        py::gil_scoped_release release;
        return build_plan(def, Problem{m, n, k, l}, tp, steps, opt);
      },
      py::arg("schedule"), py::arg("tp"), py::arg("steps"), py::arg("m"), py::arg("n"),
      py::arg("k"), py::arg("l") = 1, py::arg("partial_via") = py::none(),
      py::arg("row_scale_a") = false, py::arg("row_scale_b") = false,
      "Build the Plan of a schedule (name or definition dict). partial_via: 'epilogue' or 'copy' "
      "(how reduce-scatter partials travel), None for the library default. row_scale_a / "
      "row_scale_b: FP8 row-wise scales of A / B (one float per row; their refs in every GEMM "
      "and copy, scale slots where the rows travel; L must be 1). Raises ValueError naming the "
      "violated constraint.");

  m.def(
      "default_transport",
      [](const py::object& schedule, int tp, int steps) {
        const ScheduleDef def = resolve(schedule);
        const PartialVia via = default_plan_options(def, tp, steps).partial_via;
        return py::make_tuple(partial_via_name(via), pdl_by_default(def.collective, via));
      },
      py::arg("schedule"), py::arg("tp"), py::arg("steps"),
      "(partial_via, pdl) of the plan build_plan makes at S = steps with the default options: "
      "how its reduce-scatter partials travel and whether its GEMMs chain by programmatic "
      "dependent launch (Plan.partial_via, Plan.pdl_by_default), without building it.");

  m.def(
      "workspace_layout",
      [](const py::object& schedule, int tp, int steps, int64_t m, int64_t n, int64_t k, int64_t l,
         int slot_elem_bytes, const std::optional<std::string>& partial_via, bool row_scale_a,
         bool row_scale_b) {
        ScheduleDef def = resolve(schedule);
        Plan p = build_plan(def, Problem{m, n, k, l}, tp, steps,
                            options_from(def, tp, steps, partial_via, row_scale_a, row_scale_b));
        return layout_dict(p.layout(slot_elem_bytes));
      },
      py::arg("schedule"), py::arg("tp"), py::arg("steps"), py::arg("m"), py::arg("n"),
      py::arg("k"), py::arg("l") = 1, py::arg("slot_elem_bytes") = 2,
      py::arg("partial_via") = py::none(), py::arg("row_scale_a") = false,
      py::arg("row_scale_b") = false,
      "Byte layout of each device's symmetric workspace (extra memory per device); builds the "
      "plan (an op entry reads Plan.layout() of the plan it already has).");
  m.def(
      "workspace_control_layout", []() { return layout_dict(control_layout()); },
      "The control region every plan places right after its slots, as the layout of a plan "
      "without slots: MAX_FLAGS flags, MAX_TP barrier slots, the epoch word (total_bytes: the "
      "region); the same for every plan, so that plans of any shape share one workspace.");
  m.attr("MAX_TP") = kMaxTp;
  m.attr("MAX_EXTENT") = kMaxExtent;
  m.attr("MAX_OPERAND_ELEMENTS") = kMaxOperandElems;
  m.attr("MAX_STEPS") = kMaxSteps;
  m.attr("MAX_FLAGS") = kMaxFlags;
  m.attr("WORKSPACE_SLOT_ALIGN") = kSlotAlign;

  m.def(
      "default_steps",
      [](const py::object& schedule, int tp, int64_t m, int64_t n, int64_t k, int64_t l) {
        return default_steps(resolve(schedule), tp, Problem{m, n, k, l});
      },
      py::arg("schedule"), py::arg("tp"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("l") = 1,
      "S for steps=None (schedule/defaults.hpp): TP, or 2*TP for reduce-scatter plans from "
      "RS_TWO_STEPS_MIN_TOKENS tokens with at most RS_TWO_STEPS_MAX_K_PER_RANK of K per rank "
      "where 2*TP cuts the split mode into equal tiles and the plan and the kernel's extent rule "
      "accept it.");
  m.def(
      "default_plan",
      [](const py::object& schedule, int tp, int64_t m, int64_t n, int64_t k, int64_t l,
         bool row_scale_a, bool row_scale_b) {
        ScheduleDef def = resolve(schedule);
        PlanOptions scales;
        scales.row_scale_a = row_scale_a;
        scales.row_scale_b = row_scale_b;
        py::gil_scoped_release release;
        return default_plan(def, tp, Problem{m, n, k, l}, scales);
      },
      py::arg("schedule"), py::arg("tp"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("l") = 1, py::arg("row_scale_a") = false, py::arg("row_scale_b") = false,
      "The Plan of steps=None, built once: S = default_steps(...) with the default options "
      "(and fp8 row scales as build_plan's); ValueError naming the violated constraint, as "
      "build_plan.");
  m.attr("RS_TWO_STEPS_MIN_TOKENS") = kRsTwoStepsMinTokens;
  m.attr("RS_TWO_STEPS_MAX_K_PER_RANK") = kRsTwoStepsMaxKPerRank;

  m.def(
      "tile_map",
      [](const py::object& schedule, int tp, int steps) {
        ScheduleDef def = resolve(schedule);
        if (tp < 1 || steps < tp || steps % tp)
          throw std::invalid_argument("need 1 <= TP and S a multiple of TP");
        DistributedTileScheduler sch(def, tp, steps);
        py::list tiles, src, dst;
        for (int d = 0; d < tp; ++d) {
          py::list t, s, e;
          for (int i = 0; i < steps; ++i) {
            t.append(sch.tile(d, i));
            s.append(sch.source_device(d, i));
            e.append(sch.destination_device(d, i));
          }
          tiles.append(t);
          src.append(s);
          dst.append(e);
        }
        py::dict out;
        out["tile"] = tiles;
        out["source"] = src;
        out["destination"] = dst;
        return out;
      },
      py::arg("schedule"), py::arg("tp"), py::arg("steps"),
      "DistributedTileScheduler tables (device x iteration): tile, source device, destination.");
}
