/**
 * Stands in for a daemon that starts a VM and then dies: starts QEMU with startVm, prints
 * `{"pid":..,"startTimeTicks":..}` on stdout and exits at once without releasing anything.
 *
 *     tsx test/helpers/hypervisor-start-detached.ts '<json StartVmOptions without logger>'
 */
import { silentLogger } from '../../src/common/logger.js';
import { startVm } from '../../src/hypervisor/launcher.js';

const options = JSON.parse(process.argv[2] ?? '{}') as { qemuBinary: string; argv: string[]; workDir: string };
const vm = await startVm({ ...options, logger: silentLogger() });
process.stdout.write(`${JSON.stringify({ pid: vm.pid, startTimeTicks: vm.startTimeTicks })}\n`);
process.exit(0);
