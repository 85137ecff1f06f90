//! CUDA C++ sources of symm, embedded as strings so the driver can compile them with NVRTC at run
//! time. Nothing here needs a CUDA toolkit to build.
