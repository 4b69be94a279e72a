/* The dot products of Q4_K and Q5_K (quant/kformat.h says what each computes); none written yet, so the
 * generic driver multiplies these formats exactly through their reference dequantization. */
#ifndef QUANT_DOTS_Q4K_Q5K_H
#define QUANT_DOTS_Q4K_Q5K_H
#include "quant/kformat.h"

#define Q4_K_DOT_F32 NULL
#define Q4_K_DOT_Q8 NULL
#define Q5_K_DOT_F32 NULL
#define Q5_K_DOT_Q8 NULL
#endif
