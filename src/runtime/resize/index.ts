/**
 * Resizing a running pod VM, in one place: the pure planners (planResize, planGrowth,
 * budgetForShape), the executor that applies a plan to the VM and its cgroup (and undoes it in a
 * rollback), and the two Update*Resources rpcs. The QMP steps themselves (vCPU hot-plug,
 * virtio-mem size) are hypervisor helpers in src/hypervisor/resize.ts.
 */
export { applyResize, type ResizeCheckpoint, resizeCheckpoint, revertResize } from './apply.js';
export {
  budgetForShape,
  type GrowthHandler,
  planGrowth,
  planResize,
  type ResizeBasis,
  type ResizePlan,
  type ResizeTarget,
} from './plan.js';
