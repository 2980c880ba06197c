#version 450
#extension GL_GOOGLE_include_directive : require
// moe_rows_down_q4_desc: grouped MoE down for lists grouped by expert (prompt chunks), a row per lane. See moe_rows.glsl.
#define COLUMN_BLOCKS  // the down matrix's blob layout
#define QBITS 4
#include "moe_rows.glsl"
