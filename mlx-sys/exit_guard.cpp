// burn-mlx: keeps MLX's CUDA teardown at process exit from aborting the process.
//
// MLX 0.32.2's CUDA backend runs completion callbacks on detached worker threads
// (mlx::core::cu::Worker). When a command encoder is destroyed at exit, its worker is told to
// stop; the worker's thread then drops the last reference to the Worker, whose destructor frees a
// CUDA stream and event. If the CUDA runtime is already being torn down by then, freeing them
// fails with "driver shutting down", the destructor throws, and the C++ runtime calls
// std::terminate, which aborts the whole process with SIGABRT, although the program finished.
//
// The handler installed here recognizes exactly that case (on a thread other than the main one,
// an exception from the destructor of one of MLX's CUDA handles, "Destroy(handle_) failed: ...",
// whatever CUDA's reason: "driver shutting down" in most runs, "CUDA-capable device(s) is/are
// busy or unavailable" in 1 of 10 runs on an H100) and parks the failing thread instead of
// aborting: the exiting thread goes on and ends the process with the program's own exit status.
// Every other terminate goes to the previous handler (by default, abort).
#include <cstdlib>
#include <cstring>
#include <exception>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#else
#include <pthread.h>
#endif

namespace {

std::terminate_handler previous_handler = nullptr;

bool on_main_thread() {
#if defined(__linux__)
  return static_cast<long>(getpid()) == static_cast<long>(syscall(SYS_gettid));
#else
  return pthread_main_np() != 0;
#endif
}

bool is_cuda_handle_destructor_failure() {
  std::exception_ptr current = std::current_exception();
  if (!current) {
    return false;
  }
  try {
    std::rethrow_exception(current);
  } catch (const std::exception& e) {
    return std::strstr(e.what(), "Destroy(handle_) failed") != nullptr;
  } catch (...) {
  }
  return false;
}

[[noreturn]] void on_terminate() {
  if (!on_main_thread() && is_cuda_handle_destructor_failure()) {
    for (;;) {
      pause();
    }
  }
  if (previous_handler != nullptr) {
    previous_handler();
  }
  std::abort();
}

} // namespace

extern "C" void burn_mlx_install_terminate_guard(void) {
  static bool installed = false;
  if (installed) {
    return;
  }
  installed = true;
  previous_handler = std::set_terminate(on_terminate);
}
