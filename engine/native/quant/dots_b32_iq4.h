/* The dot products of Q5_0, Q5_1, IQ4_NL and IQ4_XS (quant/kformat.h says what each computes); none written yet, so the
 * generic driver multiplies these formats exactly through their reference dequantization. */
#ifndef QUANT_DOTS_B32_IQ4_H
#define QUANT_DOTS_B32_IQ4_H
#include "quant/kformat.h"

#define Q5_0_DOT_F32 NULL
#define Q5_0_DOT_Q8 NULL
#define Q5_1_DOT_F32 NULL
#define Q5_1_DOT_Q8 NULL
#define IQ4_NL_DOT_F32 NULL
#define IQ4_NL_DOT_Q8 NULL
#define IQ4_XS_DOT_F32 NULL
#define IQ4_XS_DOT_Q8 NULL
#endif
