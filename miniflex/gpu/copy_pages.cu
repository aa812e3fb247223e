// Gather/scatter whole KV pages between vLLM's paged per-layer caches (GPU
// memory) and MiniFlex's CPU pool (pinned host memory mapped into the GPU's
// address space, so the kernel reads and writes it over PCIe directly).
//
// The "pool" may also be a staging buffer in GPU memory laid out like pool
// slots (staged_mover.py); then this is a device-to-device gather/scatter.
//
// Compiled by NVRTC (see kernel_mover.py) with:
//   VEC     bytes per access: 16 (uint4), 8, 4, 2 or 1; every address and size
//           below is a multiple of it (the wrapper checks before launching)
//   UNROLL  accesses each thread issues before it waits for the first; host
//           memory is ~1 us away, so many loads must be in flight per SM
//
// Work item = one page of one layer of one chunk, numbered chunk by chunk,
// layer by layer (of the launch's layer range), page by page: the order of
// the chunk's bytes in its pool slot, so CTAs working on neighbouring items
// touch neighbouring host memory (random host pages cost PCIe/IOMMU
// bandwidth). Grid-stride over the items, one CTA per page at a time, its
// threads striding over the page's vectors.

#if VEC == 16
typedef uint4 vec_t;
#elif VEC == 8
typedef uint2 vec_t;
#elif VEC == 4
typedef unsigned int vec_t;
#elif VEC == 2
typedef unsigned short vec_t;
#else
typedef unsigned char vec_t;
#endif

extern "C" __global__ void miniflex_copy_pages(
    const unsigned long long* __restrict__ layers,  // address of block 0 of each layer
    const long long* __restrict__ table,  // [n_chunks * chunk_pages][2]: vLLM block (-1: skip),
                                          // pool row of layer 0
    unsigned long long pool,              // GPU address of pool row 0 (mapped host memory)
    long long n_chunks,
    int chunk_pages,         // table entries (and pool rows of one layer) per chunk
    int first_layer,         // this launch moves layers first_layer .. first_layer + n_layers - 1
    int n_layers,
    long long block_stride,  // bytes between consecutive vLLM blocks of one layer
    long long page_bytes,    // bytes of one block of one layer (one pool row)
    int to_pool)             // 1: GPU cache -> pool (store); 0: pool -> GPU cache (load)
{
    const long long page_vecs = page_bytes / VEC;
    const long long chunk_items = (long long)n_layers * chunk_pages;
    const long long items = n_chunks * chunk_items;
    const long long step = (long long)blockDim.x * UNROLL;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        const long long chunk = item / chunk_items;
        const long long in_chunk = item - chunk * chunk_items;
        const long long layer = first_layer + in_chunk / chunk_pages;
        const long long p = chunk * chunk_pages + in_chunk % chunk_pages;
        const long long block = table[2 * p];
        if (block < 0) continue;  // a partial chunk: this page is not moved
        const long long row = table[2 * p + 1] + layer * chunk_pages;
        char* dev = (char*)layers[layer] + block * block_stride;
        char* host = (char*)pool + row * page_bytes;
        const vec_t* __restrict__ src = (const vec_t*)(to_pool ? dev : host);
        vec_t* __restrict__ dst = (vec_t*)(to_pool ? host : dev);
        for (long long i = threadIdx.x; i < page_vecs; i += step) {
            vec_t buf[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long j = i + (long long)u * blockDim.x;
                if (j < page_vecs) buf[u] = src[j];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long j = i + (long long)u * blockDim.x;
                if (j < page_vecs) dst[j] = buf[u];
            }
        }
    }
}
