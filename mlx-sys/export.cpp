// burn-mlx: writing and reading MLX function files (`.mlxfn`), for `burn_mlx::export`.
//
// MLX's `export_function` traces a function once per input signature and writes the traced
// graph, with every array the function captured (a model's weights) as a constant, to a file
// that `mx.import_function` (Python), `import_function` (C++) and mlx-swift run without the
// code that built the graph. These entries wrap MLX's C++ exporter and importer for Rust:
//
// - the traced function is a C callback (Rust's closure behind it), called once per signature;
// - every signature goes into one file (MLX picks the matching one at call time);
// - a metadata string is stored in the file's header (`mx.import_function(file,
//   return_metadata=True)` reads it back in Python);
// - constants are made dense and row-major before MLX records them (see `densify_constants`);
// - every C++ exception becomes an error message for the caller instead of ending the process.
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mlx/c/array.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/vector.h"
#include "mlx/c/vector.h"
#include "mlx/export.h"
#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace {

// Set while this thread traces a function for export. MLX keeps the same state
// (`detail::in_export_tracing`), but libmlx does not export it.
thread_local bool exporting = false;

// Marks this thread as exporting for its lifetime.
struct Exporting {
  bool previous = exporting;
  Exporting() {
    exporting = true;
  }
  ~Exporting() {
    exporting = previous;
  }
};

// Copies `message` into the caller's buffer `err` of `len` bytes, NUL-terminated, cut to fit.
void write_error(char* err, size_t len, const std::string& message) {
  if (err == nullptr || len == 0) {
    return;
  }
  size_t n = std::min(len - 1, message.size());
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

// Whether `a` is a constant of the traced graph (an array with data, not one of the traced
// function's inputs) whose memory is not one dense, row-major block.
bool needs_dense_copy(const mx::array& a) {
  if (a.has_primitive() || a.is_tracer()) {
    return false;
  }
  return !a.flags().row_contiguous || a.data_size() != a.size();
}

// MLX's exporter writes a constant as its buffer lies in memory (`data()`, `nbytes()` bytes)
// and the importer reads those bytes back as a dense row-major array. An evaluated array can be
// a view instead: a transpose, a broadcast (stride 0), or the column-major result of an
// elementwise op on transposed inputs (a weight after an optimizer step). Written as it is,
// such a constant would come back scrambled or read past its buffer. So every such constant in
// the graph of `outputs` is replaced, where it is used, by a dense copy, and the copies are
// evaluated together at the end: their inputs are not tracers, so MLX allows it during the
// trace, and once evaluated they are plain constants.
void densify_constants(std::vector<mx::array>& outputs) {
  std::unordered_map<std::uintptr_t, mx::array> copies;
  auto dense = [&copies](const mx::array& a) {
    auto it = copies.find(a.id());
    if (it == copies.end()) {
      it = copies.emplace(a.id(), mx::contiguous(a, /* allow_col_major = */ false))
               .first;
    }
    return it->second;
  };
  std::unordered_set<std::uintptr_t> seen;
  std::vector<mx::array> stack;
  for (auto& out : outputs) {
    if (needs_dense_copy(out)) {
      out = dense(out);
    } else {
      stack.push_back(out);
    }
  }
  while (!stack.empty()) {
    mx::array node = stack.back();
    stack.pop_back();
    if (!node.has_primitive() || !seen.insert(node.id()).second) {
      continue;
    }
    for (auto& in : node.inputs()) {
      if (needs_dense_copy(in)) {
        in = dense(in);
      } else {
        stack.push_back(in);
      }
    }
  }
  std::vector<mx::array> pending;
  pending.reserve(copies.size());
  for (auto& [_, c] : copies) {
    pending.push_back(c);
  }
  if (!pending.empty()) {
    mx::eval(pending);
  }
}

} // namespace

// Whether this thread is tracing a function for export: burn-mlx's own CPU primitives
// (`fast_unary.cpp`) step aside then, so that the file holds only MLX's.
extern "C" bool burn_mlx_in_export() {
  return exporting;
}

// The traced function: called with `n` input handles, which the callee owns (and frees), and
// an output vector to append its results to. Returns 0, or non-zero if it failed (the callee
// keeps its own error; the export then fails with a generic message).
typedef int (*burn_mlx_export_callback)(
    void* payload,
    const mlx_array* inputs,
    size_t n,
    mlx_vector_array outputs);

// Traces `fun` once for each of `n_signatures` input lists and writes every trace to `file`.
// The lists lie back to back in `args`; `counts[i]` is the length of list `i`. With `shapeless`,
// MLX replays a trace for inputs of any shape with the same ranks and dtypes. Returns 0, or 1
// with MLX's message (or the callback's failure) written to `err`.
extern "C" int burn_mlx_export_function(
    const char* file,
    burn_mlx_export_callback fun,
    void* payload,
    const mlx_array* args,
    const size_t* counts,
    size_t n_signatures,
    bool shapeless,
    const char* metadata,
    char* err,
    size_t err_len) {
  try {
    Exporting marker;
    auto traced = [fun, payload](const mx::Args& inputs) {
      std::vector<mlx_array> handles;
      handles.reserve(inputs.size());
      for (auto& in : inputs) {
        handles.push_back(mlx_array_new_(in));
      }
      auto outputs = mlx_vector_array_new_(std::vector<mx::array>{});
      int rc = fun(payload, handles.data(), handles.size(), outputs);
      std::vector<mx::array> result = mlx_vector_array_get_(outputs);
      mlx_vector_array_free_(outputs);
      if (rc != 0) {
        throw std::runtime_error("the traced function failed");
      }
      densify_constants(result);
      return result;
    };
    auto exporter =
        mx::exporter(file, traced, shapeless, metadata ? metadata : "");
    size_t offset = 0;
    for (size_t i = 0; i < n_signatures; ++i) {
      mx::Args inputs;
      for (size_t j = 0; j < counts[i]; ++j) {
        inputs.push_back(mlx_array_get_(args[offset + j]));
      }
      offset += counts[i];
      exporter(inputs);
    }
    exporter.close();
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return 1;
  } catch (...) {
    write_error(err, err_len, "unknown C++ exception in MLX's exporter");
    return 1;
  }
}

// Reads the function file `file`. Returns an owned handle (free it with
// `burn_mlx_imported_function_free`), or null with MLX's message written to `err`.
extern "C" void* burn_mlx_import_function(
    const char* file,
    char* err,
    size_t err_len) {
  try {
    return new mx::ImportedFunction(mx::import_function(file));
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return nullptr;
  } catch (...) {
    write_error(err, err_len, "unknown C++ exception in MLX's importer");
    return nullptr;
  }
}

// Frees a handle from `burn_mlx_import_function`.
extern "C" void burn_mlx_imported_function_free(void* function) {
  delete static_cast<mx::ImportedFunction*>(function);
}

// The metadata string stored in the file; valid while the handle lives.
extern "C" const char* burn_mlx_imported_function_metadata(void* function) {
  return static_cast<mx::ImportedFunction*>(function)->metadata().c_str();
}

// Applies the imported function to `n` inputs: writes a new vector of its (lazy) outputs to
// `out` and returns 0, or returns 1 with MLX's message written to `err` (no matching signature).
extern "C" int burn_mlx_imported_function_call(
    void* function,
    const mlx_array* args,
    size_t n,
    mlx_vector_array* out,
    char* err,
    size_t err_len) {
  try {
    mx::Args inputs;
    for (size_t i = 0; i < n; ++i) {
      inputs.push_back(mlx_array_get_(args[i]));
    }
    auto outputs = (*static_cast<mx::ImportedFunction*>(function))(inputs);
    *out = mlx_vector_array_new_(std::move(outputs));
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return 1;
  } catch (...) {
    write_error(err, err_len, "unknown C++ exception in an imported MLX function");
    return 1;
  }
}
