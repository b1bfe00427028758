// burn-mlx: automatic fusion of recurring lazy graphs, at evaluation time.
//
// Burn builds an MLX graph op by op; a training step or an inference call builds the same graph
// (the same primitives, shapes and dtypes, wired the same way) every time it runs. MLX's
// `compile` turns such a graph into fewer, larger kernels (elementwise chains fused into one
// `Compiled` primitive, common subexpressions merged), but it compiles *functions*, and Burn code
// is not written as one. This file lets an evaluation do it instead:
//
// 1. Walk the pending graph of the arrays to evaluate (the arrays that are not yet scheduled),
//    in topological order. Arrays already computed or being computed are its inputs ("leaves").
// 2. Find its outputs: the arrays asked for, and every other array of the graph that something
//    outside it still holds (a Burn tensor, an autodiff node, a later lazy op). Those have to be
//    materialized, as MLX's own evaluation would. An array's holders outside the graph are its
//    reference count less the references from inside the graph.
// 3. Hash the graph's structure (primitive class, stream, shapes, dtypes, wiring, outputs). The
//    first time a structure is seen, nothing else happens: one-off graphs cost one walk.
// 4. When a structure has been seen `threshold` times, record it as a recipe (the primitives and
//    the wiring, no data) and hand a function that replays the recipe on new inputs to
//    `mlx::core::compile`. MLX traces it once, simplifies and fuses it, and caches the result.
// 5. Later graphs with the same structure are checked node by node against the recipe (same
//    primitive class and `is_equivalent` parameters, or for custom kernels their state, see
//    `equivalent`; same stream) and evaluated through the compiled function: each output array
//    of the original graph becomes a `Copy` (a buffer share, no kernel) of the matching
//    compiled output, and MLX evaluates those. A graph whose
//    top (see `fingerprint`) was last evaluated through a compiled structure skips steps 1-3:
//    one walk compares it with that structure's recipe as it goes (`verify`) and records
//    nothing; only if it differs is it walked in full.
// 6. Fusion is not always faster (MLX's fused kernels cost host time per launch too, and a
//    compiled graph can be slower than the hand-written kernels it replaces), so each structure
//    is measured: the evaluation calls before compiling (but the first) and the compiled ones
//    after the first (which builds the kernels) are timed, and after `fused_trials` compiled
//    ones the compiled graph is kept only if its best time beats the best plain one.
//
// Anything the pass does not understand (a tracer, a primitive that cannot be compared,
// collectives) leaves the graph to MLX's plain evaluation. A failure while compiling leaves the
// graph untouched, evaluates it plainly and never tries that structure again.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mlx/c/array.h"
#include "mlx/c/private/array.h"
#include "mlx/compile.h"
#include "mlx/fast_primitives.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace {

// Whether two primitives compute the same function of their inputs: MLX's `is_equivalent`, and
// for MLX's custom kernels, which do not implement it (MLX 0.32), their whole state but the
// compile options: name, source, grid, thread group, output layouts and scalars. burn-mlx's
// own kernels (column sums, layer norm's backward, the Adam update) derive their launch from
// their inputs' shapes, so a recurring step's kernels compare equal and the step can be fused.
bool equivalent(const mx::Primitive& a, const mx::Primitive& b) {
  if (std::strcmp(a.name(), "CustomKernel") != 0) {
    return a.is_equivalent(b);
  }
  if (std::strcmp(b.name(), "CustomKernel") != 0) {
    return false;
  }
  const auto sa = static_cast<const mx::fast::CustomKernel&>(a).state();
  const auto sb = static_cast<const mx::fast::CustomKernel&>(b).state();
  return std::get<0>(sa) == std::get<0>(sb) && std::get<1>(sa) == std::get<1>(sb) &&
      std::get<2>(sa) == std::get<2>(sb) && std::get<3>(sa) == std::get<3>(sb) &&
      std::get<4>(sa) == std::get<4>(sb) && std::get<5>(sa) == std::get<5>(sb) &&
      std::get<6>(sa) == std::get<6>(sb) && std::get<7>(sa) == std::get<7>(sb) &&
      std::get<8>(sa) == std::get<8>(sb) && std::get<9>(sa) == std::get<9>(sb);
}

// A value of a recorded graph: input `index` (node < 0), or output `index` of node `node`.
struct Ref {
  int32_t node;
  int32_t index;
  bool operator==(const Ref& o) const {
    return node == o.node && index == o.index;
  }
};

// One primitive application of a recorded graph.
struct Node {
  std::shared_ptr<mx::Primitive> primitive;
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  std::vector<Ref> inputs;
};

// A graph's structure without its data: what the compiled function replays.
struct Recipe {
  std::vector<Node> nodes;
  size_t n_leaves = 0;
  std::vector<Ref> outputs;
  // The inputs' shapes and dtypes, in the order of `leaves`.
  std::vector<mx::Shape> leaf_shapes;
  std::vector<mx::Dtype> leaf_dtypes;
  // Whether a node has several outputs (such recipes are matched by a full walk only).
  bool multi_output = false;
  // For each node (single-output recipes only), the handles that a full walk found the graph
  // itself holding on its array: one in `Graph::arrays`, one per use as an input.
  std::vector<long> inside;
};

// The pending graph of one evaluation.
struct Graph {
  std::vector<mx::array> leaves;
  // The original arrays of each node (its outputs, siblings included), in topological order.
  std::vector<std::vector<mx::array>> arrays;
  Recipe recipe;
  uint64_t hash = 0;
  // Sightings before this graph's structure is compiled (from its device).
  int threshold = 0;
  // A cheap summary of the graph's top: its first 64 arrays (see `fingerprint`).
  uint64_t fingerprint = 0;
};

// A structure seen before: how often, and once compiled, its recipe and compiled function.
struct Entry {
  uint64_t seen = 0;
  // Compiling failed, or the compiled graph was measured slower: evaluate plainly from now on.
  bool failed = false;
  bool slower = false;
  std::shared_ptr<const Recipe> recipe;
  std::function<std::vector<mx::array>(const std::vector<mx::array>&)> compiled;
  uint64_t last_used = 0;
  // The fastest plain and compiled evaluations measured (seconds), and how many compiled ones.
  double plain_best = 1e30;
  double fused_best = 1e30;
  int fused_samples = 0;
  // Primitives of the compiled graph (counted once, for the statistics).
  uint64_t fused_nodes = 0;
};

// Compiled evaluations timed (after the first, which includes building the kernels) before a
// structure's compiled graph is kept or dropped.
constexpr int fused_trials = 5;

// Graphs with fewer primitives are evaluated plainly and do not count for the back-off: there is
// little to fuse, and they are often the reads between the steps of a loop.
constexpr size_t min_nodes = 16;

// `BURN_MLX_FUSION_DEBUG=1`: one line per evaluation on stderr (nodes, hash, what happened).
bool debug() {
  static const bool on = [] {
    const char* v = std::getenv("BURN_MLX_FUSION_DEBUG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

// Whether the environment variable `name` is set to exactly `value`.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// `BURN_MLX_FUSION_RECOGNIZE=0`: every graph is walked in full, as before `verify` existed (for
// measuring what it saves; see docs/fusion.md).
bool recognize() {
  static const bool on = !env_is("BURN_MLX_FUSION_RECOGNIZE", "0");
  return on;
}

// Primitives whose evaluation talks to other processes: never replayed or merged.
bool is_collective(const char* name) {
  static const char* const names[] = {
      "AllReduce", "AllGather", "Send", "Recv", "ReduceScatter", "Load"};
  for (const char* n : names) {
    if (std::strcmp(name, n) == 0) {
      return true;
    }
  }
  return false;
}

// The number of `array` handles that share `a`'s descriptor. `array` holds exactly one
// `std::shared_ptr` to it (checked below), so its reference count is read through that.
static_assert(
    sizeof(mx::array) == sizeof(std::shared_ptr<void>),
    "mlx::core::array is expected to hold exactly one shared_ptr");
long handles(const mx::array& a) {
  return reinterpret_cast<const std::shared_ptr<void>&>(a).use_count();
}

inline void mix(uint64_t& h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

bool is_leaf(const mx::array& a) {
  return a.status() != mx::array::Status::unscheduled || !a.has_primitive();
}

// A table from array ids (addresses, never 0) to what the walk knows of them: their place in
// the graph, and how many handles the graph itself holds on them. Open addressing, linear
// probing: a walk touches every node a few times, and this is most of its cost.
class IdTable {
 public:
  struct Slot {
    std::uintptr_t id = 0;
    Ref ref{-1, -1};
    long inside = 0;
  };

  explicit IdTable(size_t expected) {
    size_t cap = 64;
    while (cap < expected * 2) {
      cap <<= 1;
    }
    slots_.resize(cap);
  }

  // The slot of `id`, or nullptr.
  Slot* find(std::uintptr_t id) {
    for (size_t i = index(id);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].id == id) {
        return &slots_[i];
      }
      if (slots_[i].id == 0) {
        return nullptr;
      }
    }
  }

  // The slot of `id`, created (with `ref`) if it is not there.
  Slot& insert(std::uintptr_t id, Ref ref) {
    if ((size_ + 1) * 2 > slots_.size()) {
      grow();
    }
    for (size_t i = index(id);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].id == id) {
        return slots_[i];
      }
      if (slots_[i].id == 0) {
        slots_[i].id = id;
        slots_[i].ref = ref;
        size_++;
        return slots_[i];
      }
    }
  }

 private:
  size_t index(std::uintptr_t id) const {
    return static_cast<size_t>((id >> 4) * 0x9e3779b97f4a7c15ULL) & (slots_.size() - 1);
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_ = 0;
    for (const auto& slot : old) {
      if (slot.id != 0) {
        insert(slot.id, slot.ref).inside = slot.inside;
      }
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// A summary of the graph's top: the first `fingerprint_nodes` arrays of a depth-first walk from
// the arrays asked for (primitive names, shapes, dtypes). Graphs whose structure the pass gave
// up on (measured slower, failed to compile, or unfusable) mark their fingerprint, and later
// graphs with that fingerprint skip the walk: the walk costs about a microsecond per primitive,
// which a step that is not fused should not pay. The summary goes 64 arrays deep because the
// first version, which covered only the roots and their inputs, gave every scalar loss the same
// fingerprint: a dropped MLP step kept a later CNN and decoder step (the same cross-entropy on
// top) from ever being fused. Two graphs can still share a fingerprint; see `given_up_probe`.
constexpr size_t fingerprint_nodes = 64;

uint64_t fingerprint(const std::vector<mx::array>& roots) {
  uint64_t h = 0x84222325cbf29ce4ULL;
  std::vector<const mx::array*> stack;
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    stack.push_back(&*it);
  }
  size_t visited = 0;
  while (!stack.empty() && visited < fingerprint_nodes) {
    const mx::array& a = *stack.back();
    stack.pop_back();
    visited++;
    mix(h, static_cast<uint64_t>(a.dtype().val()));
    for (auto d : a.shape()) {
      mix(h, static_cast<uint64_t>(d));
    }
    if (is_leaf(a)) {
      mix(h, 1);
      continue;
    }
    // By content: `Compiled` primitives build their name per instance.
    const char* n = a.primitive().name();
    for (size_t i = 0; i < 24 && n[i] != '\0'; ++i) {
      mix(h, static_cast<uint64_t>(n[i]));
    }
    mix(h, a.inputs().size());
    const auto& inputs = a.inputs();
    for (auto it = inputs.rbegin(); it != inputs.rend(); ++it) {
      stack.push_back(&*it);
    }
  }
  return h;
}

// What a walk found.
enum class Walked {
  // A graph the pass can compile.
  Fusable,
  // Fewer than `min_nodes` primitives: left to MLX, and not counted for the back-off.
  Small,
  // A graph the pass leaves to MLX (a tracer, a primitive that cannot be compared, collectives,
  // or fused kernels already: a graph from `compile`); counted as a new structure.
  Unfusable,
};

// Walks the pending graph of `roots` into `g`.
Walked walk(const std::vector<mx::array>& roots, Graph& g) {
  IdTable refs(1024);
  std::vector<std::pair<mx::array, size_t>> stack;
  for (const auto& root : roots) {
    if (refs.find(root.id()) != nullptr || is_leaf(root)) {
      continue;
    }
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      size_t next = stack.back().second;
      const auto& inputs = stack.back().first.inputs();
      if (next < inputs.size()) {
        stack.back().second++;
        const mx::array& in = inputs[next];
        if (refs.find(in.id()) != nullptr) {
          continue;
        }
        if (in.is_tracer()) {
          return Walked::Unfusable;
        }
        if (is_leaf(in)) {
          refs.insert(in.id(), Ref{-1, static_cast<int32_t>(g.leaves.size())});
          g.leaves.push_back(in);
        } else {
          mx::array copy = in; // `inputs` lives in the array that the push may move
          stack.emplace_back(std::move(copy), 0);
        }
        continue;
      }
      mx::array a = std::move(stack.back().first);
      stack.pop_back();
      if (refs.find(a.id()) != nullptr) {
        continue; // a sibling of a node finished earlier
      }
      if (a.is_tracer()) {
        return Walked::Unfusable;
      }
      auto& primitive = a.primitive();
      if (is_collective(primitive.name()) || !equivalent(primitive, primitive) ||
          std::strncmp(primitive.name(), "Compiled", 8) == 0) {
        if (debug()) {
          std::fprintf(stderr, "burn-mlx fusion: not fused, primitive %s\n", primitive.name());
        }
        return Walked::Unfusable;
      }
      Node node;
      node.primitive = a.primitive_ptr();
      node.inputs.reserve(a.inputs().size());
      for (const auto& in : a.inputs()) {
        node.inputs.push_back(refs.find(in.id())->ref);
      }
      int32_t index = static_cast<int32_t>(g.arrays.size());
      std::vector<mx::array> outputs;
      if (a.siblings().empty()) {
        outputs.push_back(std::move(a));
      } else {
        outputs = a.outputs();
      }
      node.shapes.reserve(outputs.size());
      node.dtypes.reserve(outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        node.shapes.push_back(outputs[i].shape());
        node.dtypes.push_back(outputs[i].dtype());
        refs.insert(outputs[i].id(), Ref{index, static_cast<int32_t>(i)});
      }
      g.recipe.nodes.push_back(std::move(node));
      g.arrays.push_back(std::move(outputs));
    }
  }
  if (g.recipe.nodes.size() < min_nodes) {
    return Walked::Small;
  }
  g.recipe.n_leaves = g.leaves.size();

  // Outputs: the arrays asked for, and every array held from outside the graph. Inside it, an
  // array is held once by `g.arrays`, once by each of its siblings, and once per use as an input
  // (each output of a multi-output node keeps its own copy of the node's inputs).
  for (const auto& outputs : g.arrays) {
    for (const auto& out : outputs) {
      refs.find(out.id())->inside += static_cast<long>(outputs.size());
      for (const auto& in : out.inputs()) {
        refs.find(in.id())->inside += 1;
      }
    }
  }
  std::vector<Ref> outputs;
  for (const auto& root : roots) {
    auto* slot = refs.find(root.id());
    if (slot != nullptr && slot->ref.node >= 0) {
      outputs.push_back(slot->ref);
    }
  }
  for (size_t n = 0; n < g.arrays.size(); ++n) {
    for (size_t i = 0; i < g.arrays[n].size(); ++i) {
      const auto& a = g.arrays[n][i];
      if (handles(a) > refs.find(a.id())->inside) {
        outputs.push_back(Ref{static_cast<int32_t>(n), static_cast<int32_t>(i)});
      }
    }
  }
  for (const auto& outputs_of_node : g.arrays) {
    g.recipe.multi_output = g.recipe.multi_output || outputs_of_node.size() > 1;
  }
  if (!g.recipe.multi_output) {
    g.recipe.inside.reserve(g.arrays.size());
    for (const auto& outputs_of_node : g.arrays) {
      g.recipe.inside.push_back(refs.find(outputs_of_node[0].id())->inside);
    }
  }
  std::sort(outputs.begin(), outputs.end(), [](const Ref& a, const Ref& b) {
    return a.node != b.node ? a.node < b.node : a.index < b.index;
  });
  outputs.erase(std::unique(outputs.begin(), outputs.end()), outputs.end());
  g.recipe.outputs = std::move(outputs);

  // The structure's hash.
  uint64_t h = 0xcbf29ce484222325ULL;
  mix(h, g.leaves.size());
  g.recipe.leaf_shapes.reserve(g.leaves.size());
  g.recipe.leaf_dtypes.reserve(g.leaves.size());
  for (const auto& leaf : g.leaves) {
    g.recipe.leaf_shapes.push_back(leaf.shape());
    g.recipe.leaf_dtypes.push_back(leaf.dtype());
    mix(h, static_cast<uint64_t>(leaf.dtype().val()));
    mix(h, leaf.ndim());
    for (auto d : leaf.shape()) {
      mix(h, static_cast<uint64_t>(d));
    }
  }
  for (const auto& node : g.recipe.nodes) {
    // The name is a string literal of the primitive's class: one address per class.
    mix(h, reinterpret_cast<std::uintptr_t>(node.primitive->name()));
    const auto& stream = node.primitive->stream();
    mix(h, static_cast<uint64_t>(stream.index));
    mix(h, static_cast<uint64_t>(stream.device.type));
    mix(h, node.shapes.size());
    for (size_t i = 0; i < node.shapes.size(); ++i) {
      mix(h, static_cast<uint64_t>(node.dtypes[i].val()));
      mix(h, node.shapes[i].size());
      for (auto d : node.shapes[i]) {
        mix(h, static_cast<uint64_t>(d));
      }
    }
    mix(h, node.inputs.size());
    for (const auto& r : node.inputs) {
      mix(h, static_cast<uint64_t>(static_cast<uint32_t>(r.node)));
      mix(h, static_cast<uint64_t>(r.index));
    }
  }
  for (const auto& r : g.recipe.outputs) {
    mix(h, static_cast<uint64_t>(r.node));
    mix(h, static_cast<uint64_t>(r.index));
  }
  g.hash = h;
  return Walked::Fusable;
}

// Whether `g` has exactly the structure of `recipe`, primitive parameters included.
bool matches(const Graph& g, const Recipe& recipe) {
  const auto& nodes = g.recipe.nodes;
  if (nodes.size() != recipe.nodes.size() || g.leaves.size() != recipe.n_leaves ||
      !(g.recipe.outputs == recipe.outputs)) {
    return false;
  }
  // Leaf shapes and dtypes are in the hash, and MLX's compile cache checks them on each call.
  for (size_t n = 0; n < nodes.size(); ++n) {
    const auto& a = nodes[n];
    const auto& b = recipe.nodes[n];
    if (!(a.inputs == b.inputs) || a.shapes != b.shapes || a.dtypes != b.dtypes) {
      return false;
    }
    const mx::Primitive& pa = *a.primitive;
    const mx::Primitive& pb = *b.primitive;
    if (typeid(pa) != typeid(pb) || std::strcmp(pa.name(), pb.name()) != 0 ||
        a.primitive->stream() != b.primitive->stream() || !equivalent(pa, pb)) {
      return false;
    }
  }
  return true;
}

// Whether the pending graph of `roots` has exactly the structure of `recipe`, checked in one
// walk that records nothing: the fast path for a step that recurs. The full walk (`walk`, then
// the hash, then `matches`) copies every node into a `Node` (a primitive handle and three small
// vectors) and every array into `Graph::arrays`; on the H100's host that cost 1.3-1.6 us per
// primitive, 5-7 ms of the decoder LM's 4,266-primitive step. This walk visits the arrays in the
// same order through pointers (the roots hold the graph, and nothing changes it meanwhile),
// compares each node with the recipe's as it finishes, and counts a node as an output the way
// `walk` does, from the handles on it less the graph's own (`Recipe::inside`; `nodes` holds
// one, as `Graph::arrays` does). On success, `leaves` holds the inputs, `nodes` every node's
// array in the recipe's order and `originals` the arrays that the recipe's outputs name, in
// their order.
bool verify(
    const std::vector<mx::array>& roots,
    const Recipe& recipe,
    std::vector<mx::array>& leaves,
    std::vector<mx::array>& nodes,
    std::vector<mx::array>& originals) {
  if (recipe.multi_output) {
    return false;
  }
  IdTable refs(recipe.nodes.size() + recipe.n_leaves);
  nodes.reserve(recipe.nodes.size());
  leaves.reserve(recipe.n_leaves);
  std::vector<std::pair<const mx::array*, size_t>> stack;
  for (const auto& root : roots) {
    if (refs.find(root.id()) != nullptr || is_leaf(root)) {
      continue;
    }
    stack.emplace_back(&root, 0);
    while (!stack.empty()) {
      const mx::array& top = *stack.back().first;
      size_t next = stack.back().second;
      if (next < top.inputs().size()) {
        stack.back().second++;
        const mx::array& in = top.inputs()[next];
        if (refs.find(in.id()) != nullptr) {
          continue;
        }
        if (in.is_tracer()) {
          return false;
        }
        if (is_leaf(in)) {
          size_t k = leaves.size();
          if (k >= recipe.n_leaves || in.dtype() != recipe.leaf_dtypes[k] ||
              in.shape() != recipe.leaf_shapes[k]) {
            return false;
          }
          refs.insert(in.id(), Ref{-1, static_cast<int32_t>(k)});
          leaves.push_back(in);
        } else {
          stack.emplace_back(&in, 0);
        }
        continue;
      }
      stack.pop_back();
      if (refs.find(top.id()) != nullptr) {
        continue;
      }
      size_t n = nodes.size();
      if (n >= recipe.nodes.size() || top.is_tracer() || !top.siblings().empty()) {
        return false;
      }
      const Node& want = recipe.nodes[n];
      mx::Primitive& p = top.primitive();
      mx::Primitive& q = *want.primitive;
      if (typeid(p) != typeid(q) || std::strcmp(p.name(), q.name()) != 0 ||
          p.stream() != q.stream() || top.dtype() != want.dtypes[0] ||
          top.shape() != want.shapes[0] || top.inputs().size() != want.inputs.size()) {
        return false;
      }
      for (size_t j = 0; j < want.inputs.size(); ++j) {
        if (!(refs.find(top.inputs()[j].id())->ref == want.inputs[j])) {
          return false;
        }
      }
      if (!equivalent(p, q)) {
        return false;
      }
      refs.insert(top.id(), Ref{static_cast<int32_t>(n), 0});
      nodes.push_back(top);
    }
  }
  if (nodes.size() != recipe.nodes.size() || leaves.size() != recipe.n_leaves) {
    return false;
  }
  // The outputs: the roots, and every array held from outside the graph.
  std::vector<bool> is_output(nodes.size(), false);
  for (const auto& root : roots) {
    auto* slot = refs.find(root.id());
    if (slot != nullptr && slot->ref.node >= 0) {
      is_output[slot->ref.node] = true;
    }
  }
  size_t k = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!is_output[n] && handles(nodes[n]) <= recipe.inside[n]) {
      continue;
    }
    if (k >= recipe.outputs.size() || recipe.outputs[k].node != static_cast<int32_t>(n)) {
      return false;
    }
    k++;
  }
  if (k != recipe.outputs.size()) {
    return false;
  }
  originals.reserve(k);
  for (const auto& r : recipe.outputs) {
    originals.push_back(nodes[r.node]);
  }
  return true;
}

// `BURN_MLX_FUSION_RELEASE=mlx`: the original graph of a fused evaluation is freed by MLX's array
// destructor alone, as before `free_graph` existed (for measuring what it saves; see
// docs/fusion.md).
bool release_by_mlx() {
  static const bool on = env_is("BURN_MLX_FUSION_RELEASE", "mlx");
  return on;
}

// Frees the original graph of a fused evaluation, once its outputs point at the compiled
// results: `nodes` holds every node's array in the recipe's order (empty for recipes with
// multi-output nodes, which MLX's destructor frees alone), `outputs` names the outputs. MLX's
// array destructor, for an array whose inputs are not empty, gathers them in a hash map before
// letting them go (so that freeing a long chain does not recurse); that was 2.4-2.9 ms of the
// decoder LM's step on the H100's host. Taking every other node's inputs first, into one
// vector, lets each destructor return at once. Nodes that are not outputs are held by nothing
// outside the graph (see `walk`), so emptying them changes nothing anyone can see.
void free_graph(std::vector<mx::array>& nodes, const std::vector<Ref>& outputs) {
  if (!release_by_mlx()) {
    std::vector<mx::array> inputs;
    inputs.reserve(nodes.size() * 2);
    size_t k = 0;
    for (size_t n = 0; n < nodes.size(); ++n) {
      while (k < outputs.size() && outputs[k].node < static_cast<int32_t>(n)) {
        k++;
      }
      if (k < outputs.size() && outputs[k].node == static_cast<int32_t>(n)) {
        continue; // its inputs are the compiled result's now
      }
      auto& ins = nodes[n].inputs();
      std::move(ins.begin(), ins.end(), std::back_inserter(inputs));
      ins.clear();
    }
    inputs.clear();
  }
  nodes.clear();
}

// Builds the recorded graph again on `inputs` (the tracers of MLX's compile).
std::vector<mx::array> replay(const Recipe& recipe, const std::vector<mx::array>& inputs) {
  std::vector<std::vector<mx::array>> values;
  values.reserve(recipe.nodes.size());
  auto value = [&](const Ref& r) -> const mx::array& {
    return r.node < 0 ? inputs[r.index] : values[r.node][r.index];
  };
  for (const auto& node : recipe.nodes) {
    std::vector<mx::array> ins;
    ins.reserve(node.inputs.size());
    for (const auto& r : node.inputs) {
      ins.push_back(value(r));
    }
    if (node.shapes.size() == 1) {
      values.push_back({mx::array(node.shapes[0], node.dtypes[0], node.primitive, std::move(ins))});
    } else {
      values.push_back(mx::array::make_arrays(node.shapes, node.dtypes, node.primitive, ins));
    }
  }
  std::vector<mx::array> outputs;
  outputs.reserve(recipe.outputs.size());
  for (const auto& r : recipe.outputs) {
    outputs.push_back(value(r));
  }
  return outputs;
}

// Process-wide state. burn-mlx evaluates under one lock; this mutex keeps the pass safe anyway.
// The table is never destroyed: at exit, MLX's own state may be gone before static destructors
// would run, and the table holds MLX primitives.
std::mutex state_mutex;
// Sightings before a structure is compiled, by the device its graph runs on (0: never); the GPU
// default is burn_mlx::fusion::DEFAULT_THRESHOLD. On the CPU the default is off: MLX builds each
// fused kernel with the system C++ compiler, and the CPU Transformer step was not faster fused
// (BENCHMARKS.md).
std::atomic<int> gpu_threshold{5};
std::atomic<int> cpu_threshold{0};

int threshold_for(const mx::array& a) {
  return a.primitive().device() == mx::Device::cpu ? cpu_threshold.load() : gpu_threshold.load();
}
std::unordered_map<uint64_t, Entry>& entries = *new std::unordered_map<uint64_t, Entry>();
uint64_t clock_ = 0;
// Fingerprints of graphs the pass gave up on (see `fingerprint`), with how many evaluations
// skipped the walk for each; forgotten when too many.
std::unordered_map<uint64_t, uint32_t>& given_up = *new std::unordered_map<uint64_t, uint32_t>();
// Every `given_up_probe`-th evaluation with a given-up fingerprint is walked anyway; if its
// structure is not one the pass gave up on (two graphs shared the fingerprint), the mark goes.
constexpr uint32_t given_up_probe = 16;

void give_up(uint64_t fp) {
  if (given_up.size() > 4096) {
    given_up.clear();
  }
  given_up.emplace(fp, 0);
}

// Whether an evaluation with fingerprint `fp` skips the walk because of a give-up mark (under
// `state_mutex`); sets `probe` when it is walked only as a probe.
bool given_up_skips(uint64_t fp, bool& probe) {
  auto it = given_up.find(fp);
  if (it == given_up.end()) {
    return false;
  }
  if (++it->second % given_up_probe == 0) {
    probe = true;
    return false;
  }
  return true;
}

// Nanoseconds from `t` to now.
uint64_t nanos_since(std::chrono::steady_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t)
          .count());
}

// Counters, read by `burn_mlx_fusion_stats`.
std::atomic<uint64_t> stat_evals{0}, stat_fused{0}, stat_compiled{0}, stat_failed{0},
    stat_nodes{0}, stat_fused_nodes{0}, stat_slower{0}, stat_pass_ns{0}, stat_call_ns{0},
    stat_recognized{0};

// The primitives (not yet scheduled) that evaluating `roots` runs, each counted once.
uint64_t count_pending(const std::vector<mx::array>& roots) {
  std::unordered_set<std::uintptr_t> seen;
  std::vector<mx::array> stack(roots.begin(), roots.end());
  uint64_t n = 0;
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    if (is_leaf(a) || !seen.insert(a.primitive_id()).second) {
      continue;
    }
    n++;
    for (const auto& in : a.inputs()) {
      stack.push_back(in);
    }
  }
  return n;
}

// Structures remembered (seen at least once) and compiled functions kept, at most.
constexpr size_t max_seen = 4096;
constexpr size_t max_compiled = 64;

// Drops the least recently used compiled structures beyond `max_compiled`, and forgets the
// structures seen but not compiled when there are too many.
void trim() {
  if (entries.size() > max_seen) {
    for (auto it = entries.begin(); it != entries.end();) {
      it = it->second.compiled ? std::next(it) : entries.erase(it);
    }
  }
  size_t compiled = 0;
  for (const auto& [_, e] : entries) {
    compiled += e.compiled ? 1 : 0;
  }
  while (compiled > max_compiled) {
    auto oldest = entries.end();
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->second.compiled &&
          (oldest == entries.end() || it->second.last_used < oldest->second.last_used)) {
        oldest = it;
      }
    }
    entries.erase(oldest);
    compiled--;
  }
}

using CompiledFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// What to do with a graph: evaluate it plainly, or through `fn`, and whether to time it.
struct Plan {
  CompiledFn fn;
  std::shared_ptr<const Recipe> recipe;
  // Time this evaluation for the structure's plain or compiled record.
  bool measure = false;
  // The primitives of the compiled graph, once counted (0: not yet).
  uint64_t fused_nodes = 0;
  // The structure failed to compile or was measured slower.
  bool given_up = false;
};

// Back-off for programs whose graphs never recur (an eager decode loop whose cache grows builds
// a new structure for every token): after `miss_limit` new structures in a row, the next
// evaluations skip the walk, for `skip_len` of them; each further run of misses doubles that,
// up to `max_skip`; a structure seen again resets it. During a skip, every `probe_every`-th
// evaluation is walked anyway, and one that finds a known structure ends the skip: without
// the probes, a training loop that starts while a long skip runs (a new model, after a phase of
// one-off graphs) went unfused for up to 256 evaluations.
constexpr int miss_limit = 8;
constexpr int min_skip = 16;
constexpr int max_skip = 256;
constexpr int probe_every = 8;
int misses = 0;
int skip_len = min_skip;
int skip_left = 0;

// Whether this evaluation skips the pass (under `state_mutex`).
bool skipping() {
  if (skip_left > 0) {
    skip_left--;
    return skip_left % probe_every != 0;
  }
  return false;
}

// Counts a run of new structures, and starts skipping when it is long enough.
void note_structure(bool is_new) {
  if (!is_new) {
    if (skip_left > 0 && debug()) {
      std::fprintf(stderr, "burn-mlx fusion: a known structure ends the back-off\n");
    }
    misses = 0;
    skip_len = min_skip;
    skip_left = 0;
    return;
  }
  if (++misses >= miss_limit) {
    misses = 0;
    skip_left = skip_len;
    if (debug()) {
      std::fprintf(
          stderr, "burn-mlx fusion: %d new structures in a row: back-off for %d evaluations\n",
          miss_limit, skip_len);
    }
    skip_len = std::min(skip_len * 2, max_skip);
  }
}

// Fingerprints of graphs last evaluated through a compiled structure, with that structure's
// hash: the next evaluation with the same fingerprint is checked against its recipe by `verify`
// before it is walked in full (under `state_mutex`).
std::unordered_map<uint64_t, uint64_t>& recurring = *new std::unordered_map<uint64_t, uint64_t>();

void remember_recurring(uint64_t fp, uint64_t hash) {
  if (recurring.size() > max_seen) {
    recurring.clear();
  }
  recurring[fp] = hash;
}

// A compiled structure that graphs with a given fingerprint were last evaluated through.
struct Known {
  uint64_t hash = 0;
  std::shared_ptr<const Recipe> recipe;
};

// The compiled structure last evaluated for fingerprint `fp`, if it is still compiled.
Known known_for(uint64_t fp) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = recurring.find(fp);
  if (it == recurring.end()) {
    return {};
  }
  auto e = entries.find(it->second);
  if (e == entries.end() || !e->second.compiled) {
    recurring.erase(it);
    return {};
  }
  return {it->second, e->second.recipe};
}

// The plan for a graph that `verify` found to have the structure `known` (matched), or that it
// did not (the fingerprint's next graph is walked in full).
Plan plan_known(const Known& known, uint64_t fp, bool matched) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = entries.find(known.hash);
  if (!matched || it == entries.end() || !it->second.compiled) {
    recurring.erase(fp);
    return {};
  }
  Entry& e = it->second;
  e.seen++;
  e.last_used = ++clock_;
  note_structure(false);
  if (debug()) {
    std::fprintf(
        stderr,
        "burn-mlx fusion: %zu nodes, structure %016llx seen %llu (compiled, recognized without "
        "a full walk)\n",
        known.recipe->nodes.size(),
        static_cast<unsigned long long>(known.hash),
        static_cast<unsigned long long>(e.seen));
  }
  return {e.compiled, e.recipe, e.fused_samples <= fused_trials, e.fused_nodes};
}

// The plan for `g`: its structure's compiled function once it has been seen `threshold` times
// (compiled now if needed), unless compiling failed or the compiled graph was measured slower.
Plan plan_for(Graph& g) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto& e = entries[g.hash];
  e.seen++;
  e.last_used = ++clock_;
  note_structure(e.seen == 1);
  if (debug()) {
    std::fprintf(
        stderr,
        "burn-mlx fusion: %zu nodes, %zu inputs, %zu outputs, structure %016llx seen %llu%s\n",
        g.recipe.nodes.size(),
        g.leaves.size(),
        g.recipe.outputs.size(),
        static_cast<unsigned long long>(g.hash),
        static_cast<unsigned long long>(e.seen),
        e.failed ? " (failed)" : e.slower ? " (slower compiled)" : e.compiled ? " (compiled)" : "");
  }
  if (e.failed || e.slower) {
    Plan p;
    p.given_up = true;
    return p;
  }
  if (e.compiled) {
    if (!matches(g, *e.recipe)) {
      return {};
    }
    remember_recurring(g.fingerprint, g.hash);
    return {e.compiled, e.recipe, e.fused_samples <= fused_trials, e.fused_nodes};
  }
  if (e.seen < static_cast<uint64_t>(g.threshold)) {
    if (entries.size() > max_seen) {
      trim();
    }
    // The first sighting pays one-time costs (allocations, library set-up): not timed.
    return {nullptr, nullptr, e.seen > 1};
  }
  auto recipe = std::make_shared<const Recipe>(std::move(g.recipe));
  e.recipe = recipe;
  remember_recurring(g.fingerprint, g.hash);
  e.compiled = mx::compile(
      [recipe](const std::vector<mx::array>& inputs) { return replay(*recipe, inputs); });
  auto fn = e.compiled;
  stat_compiled++;
  trim();
  return {fn, recipe, true, 0};
}

// Remembers how many primitives the compiled graph of structure `hash` has.
void set_fused_nodes(uint64_t hash, uint64_t n) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = entries.find(hash);
  if (it != entries.end()) {
    it->second.fused_nodes = n;
  }
}

// Records how long an evaluation of structure `hash` took, and once the compiled graph has been
// timed `fused_trials` times, keeps it only if its best time beats the best plain one.
void record(uint64_t hash, uint64_t fp, bool fused, double secs) {
  std::lock_guard<std::mutex> lock(state_mutex);
  auto it = entries.find(hash);
  if (it == entries.end()) {
    return;
  }
  Entry& e = it->second;
  if (!fused) {
    e.plain_best = std::min(e.plain_best, secs);
    return;
  }
  // The first compiled evaluation builds the kernels: not a measure of the steady state.
  if (e.fused_samples++ > 0) {
    e.fused_best = std::min(e.fused_best, secs);
  }
  if (e.fused_samples > fused_trials && e.plain_best < 1e30) {
    bool keep = e.fused_best < e.plain_best;
    if (debug()) {
      std::fprintf(
          stderr,
          "burn-mlx fusion: structure %016llx best plain %.1f us, best compiled %.1f us: %s\n",
          static_cast<unsigned long long>(hash),
          e.plain_best * 1e6,
          e.fused_best * 1e6,
          keep ? "kept" : "dropped");
    }
    if (!keep) {
      e.slower = true;
      e.compiled = nullptr;
      e.recipe = nullptr;
      give_up(fp);
      stat_slower++;
    }
  }
}

void mark_failed(uint64_t hash, uint64_t fp) {
  std::lock_guard<std::mutex> lock(state_mutex);
  give_up(fp);
  auto it = entries.find(hash);
  if (it != entries.end()) {
    it->second.failed = true;
    it->second.compiled = nullptr;
  }
  stat_failed++;
}

void plain(const std::vector<mx::array>& arrays, bool wait) {
  if (wait) {
    mx::eval(arrays);
  } else {
    mx::async_eval(arrays);
  }
}

void write_error(char* err, size_t err_len, const char* what) {
  if (err != nullptr && err_len > 0) {
    std::snprintf(err, err_len, "%s", what);
  }
}

} // namespace

// Evaluates `arrays` (waiting for them when `wait`, otherwise as MLX's `async_eval`), through a
// compiled function when their graph's structure recurs (see the top of this file). Returns 0,
// or 1 with MLX's message in `err`.
extern "C" int burn_mlx_eval(
    const mlx_array* arrays,
    size_t n,
    bool wait,
    char* err,
    size_t err_len) {
  try {
    std::vector<mx::array> roots;
    roots.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      roots.push_back(mlx_array_get_(arrays[i]));
    }
    stat_evals++;
    auto start = std::chrono::steady_clock::now();
    auto since = [&start] {
      return static_cast<double>(nanos_since(start)) * 1e-9;
    };
    // The pass's own host time (walk, match, compiled function, rewiring, releasing the original
    // graph), up to the hand-over to MLX's evaluation.
    auto charge = [&start] {
      stat_pass_ns += nanos_since(start);
    };
    Graph g;
    for (const auto& root : roots) {
      if (!is_leaf(root)) {
        g.threshold = threshold_for(root);
        break;
      }
    }
    bool skip = g.threshold <= 0;
    bool probe = false;
    if (!skip) {
      g.fingerprint = fingerprint(roots);
      std::lock_guard<std::mutex> lock(state_mutex);
      skip = given_up_skips(g.fingerprint, probe) || (!probe && skipping());
    }
    // A graph whose fingerprint was last evaluated through a compiled structure is first checked
    // against that structure's recipe, without a full walk.
    Plan plan;
    std::vector<mx::array> originals;
    // Every node's array, in the recipe's order, while the original graph is rewired.
    std::vector<mx::array> nodes;
    Known known;
    if (!skip && recognize()) {
      known = known_for(g.fingerprint);
    }
    if (known.recipe) {
      bool matched = verify(roots, *known.recipe, g.leaves, nodes, originals);
      plan = plan_known(known, g.fingerprint, matched);
      if (plan.fn) {
        g.hash = known.hash;
        stat_recognized++;
      } else {
        g.leaves.clear();
        nodes.clear();
        originals.clear();
      }
    }
    if (!plan.fn) {
      Walked walked = skip ? Walked::Small : walk(roots, g);
      if (walked != Walked::Fusable) {
        if (walked == Walked::Unfusable) {
          std::lock_guard<std::mutex> lock(state_mutex);
          note_structure(true);
          give_up(g.fingerprint);
        }
        g = Graph{};
        charge();
        plain(roots, wait);
        return 0;
      }
      plan = plan_for(g);
      if (probe && !plan.given_up) {
        // A probe found a live structure behind a given-up fingerprint: stop skipping it.
        std::lock_guard<std::mutex> lock(state_mutex);
        given_up.erase(g.fingerprint);
      }
      if (!plan.fn) {
        // Drop the walk's handles first, so that MLX may reuse the buffers of arrays that only
        // the graph holds.
        g.leaves.clear();
        g.arrays.clear();
        charge();
        plain(roots, wait);
        if (plan.measure) {
          record(g.hash, g.fingerprint, false, since());
        }
        return 0;
      }
      originals.reserve(plan.recipe->outputs.size());
      for (const Ref& r : plan.recipe->outputs) {
        originals.push_back(g.arrays[r.node][r.index]);
      }
      if (!plan.recipe->multi_output) {
        nodes.reserve(g.arrays.size());
        for (auto& outputs_of_node : g.arrays) {
          nodes.push_back(std::move(outputs_of_node[0]));
        }
      }
      g.arrays.clear();
    }
    std::vector<mx::array> results;
    try {
      auto call_start = std::chrono::steady_clock::now();
      results = plan.fn(g.leaves);
      stat_call_ns += nanos_since(call_start);
      if (results.size() != plan.recipe->outputs.size()) {
        throw std::runtime_error("the compiled graph returned a different number of outputs");
      }
    } catch (const std::exception& e) {
      if (debug()) {
        std::fprintf(stderr, "burn-mlx fusion: compiling failed: %s\n", e.what());
      }
      // Nothing was changed yet: evaluate the original graph, and never compile this again.
      mark_failed(g.hash, g.fingerprint);
      g.leaves.clear();
      nodes.clear();
      originals.clear();
      charge();
      plain(roots, wait);
      return 0;
    }
    // Each output array of the original graph becomes a copy (a buffer share, no kernel) of the
    // compiled graph's matching output; the rest of the original graph is then held by `nodes`
    // alone, and freed.
    for (size_t k = 0; k < results.size(); ++k) {
      mx::array& original = originals[k];
      mx::array copy = mx::copy(results[k], original.primitive().stream());
      original.primitive_ptr() = copy.primitive_ptr();
      original.inputs() = copy.inputs();
      original.set_siblings({}, 0);
    }
    results.clear();
    g.leaves.clear();
    free_graph(nodes, plan.recipe->outputs);
    stat_fused++;
    stat_nodes += plan.recipe->nodes.size();
    if (plan.fused_nodes == 0) {
      plan.fused_nodes = count_pending(originals);
      set_fused_nodes(g.hash, plan.fused_nodes);
    }
    stat_fused_nodes += plan.fused_nodes;
    charge();
    plain(originals, wait);
    if (plan.measure) {
      record(g.hash, g.fingerprint, true, since());
    }
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return 1;
  }
}

// Sets how many times a graph structure must be seen before it is compiled, for graphs on the
// GPU (`gpu` true) or the CPU (0: never, plain evaluation only). Compiled structures are kept.
extern "C" void burn_mlx_fusion_set_threshold(bool gpu, int n) {
  (gpu ? gpu_threshold : cpu_threshold).store(n < 0 ? 0 : n);
}

// The current threshold for the GPU (`gpu` true) or the CPU.
extern "C" int burn_mlx_fusion_threshold(bool gpu) {
  return (gpu ? gpu_threshold : cpu_threshold).load();
}

// The pass's counters: evaluations, evaluations through a compiled graph, structures compiled,
// structures whose compilation failed, primitives of the original graphs that ran through
// compiled graphs, the primitives of the compiled graphs that replaced them, structures whose
// compiled graph was measured slower than the plain one (and dropped), the nanoseconds of host
// time the pass itself spent, the part of those spent inside compiled functions, and the
// evaluations whose graph `verify` recognized as a compiled structure without a full walk.
extern "C" void burn_mlx_fusion_stats(uint64_t* out) {
  out[9] = stat_recognized.load();
  out[8] = stat_call_ns.load();
  out[7] = stat_pass_ns.load();
  out[5] = stat_fused_nodes.load();
  out[6] = stat_slower.load();
  out[0] = stat_evals.load();
  out[1] = stat_fused.load();
  out[2] = stat_compiled.load();
  out[3] = stat_failed.load();
  out[4] = stat_nodes.load();
}

// Forgets every structure and compiled function.
extern "C" void burn_mlx_fusion_clear() {
  std::lock_guard<std::mutex> lock(state_mutex);
  entries.clear();
  given_up.clear();
  recurring.clear();
  misses = 0;
  skip_len = min_skip;
  skip_left = 0;
}
