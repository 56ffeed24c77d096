// RECPS_HOST_DEVICE: marks a function that CUDA code may call on the device
// as well as on the host (empty outside nvcc).
#ifndef RECPS_COMMON_HOST_DEVICE_H_
#define RECPS_COMMON_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define RECPS_HOST_DEVICE __host__ __device__
#else
#define RECPS_HOST_DEVICE
#endif

#endif  // RECPS_COMMON_HOST_DEVICE_H_
