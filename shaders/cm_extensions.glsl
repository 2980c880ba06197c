// cm_extensions.glsl: the extensions of the matrix-core kernels (cm_slice_tile.glsl's includers and
// dec_attention_cm.glsl), included first: GLSL takes an #extension only before any declaration.
// CM_EMULATE (their test variants) leaves the cooperative matrices out.
#extension GL_EXT_control_flow_attributes : require
#ifndef CM_EMULATE
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
