#version 450
#extension GL_GOOGLE_include_directive : require
// moe_rows_down_q8_bda: grouped MoE down for lists grouped by expert (prompt chunks), a row per lane. See moe_rows.glsl.
#define COLUMN_BLOCKS  // the down matrix's blob layout
#define ADDR_BDA
#define QBITS 8
#include "moe_rows.glsl"
