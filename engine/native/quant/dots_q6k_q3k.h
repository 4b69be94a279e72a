/* The dot products of Q6_K and Q3_K (quant/kformat.h says what each computes); none written yet, so the
 * generic driver multiplies these formats exactly through their reference dequantization. */
#ifndef QUANT_DOTS_Q6K_Q3K_H
#define QUANT_DOTS_Q6K_Q3K_H
#include "quant/kformat.h"

#define Q6_K_DOT_F32 NULL
#define Q6_K_DOT_Q8 NULL
#define Q3_K_DOT_F32 NULL
#define Q3_K_DOT_Q8 NULL
#endif
