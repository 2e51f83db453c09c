/* dtype.h — the element types of weight tensors, shared by the format layer (which reads
 * them from safetensors headers) and the kernels (which multiply them). Below both, so the
 * kernels need not include a file format.
 *
 * K3_DT_I8 never comes from a checkpoint: it is the packed int8 spine (src/format/packed.h);
 * K3_DT_I8_Q8 is the same data multiplied with int8 activations (--approx, kernels.h);
 * K3_DT_BF16LX is the lossless BF16 spine (issue 33): the same bits, 12 per weight (kernels.h). */
#ifndef K3_DTYPE_H
#define K3_DTYPE_H

enum k3_dtype { K3_DT_F32 = 0, K3_DT_BF16 = 1, K3_DT_U8 = 2, K3_DT_I8 = 3, K3_DT_I8_Q8 = 4,
                K3_DT_BF16LX = 5 };

#endif
