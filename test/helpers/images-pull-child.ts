// Runs one PullImage in its own process so a test can SIGKILL it halfway (a daemon crash).
// argv: <stateDir> <registriesFile> <reference>
import { silentLogger } from '../../src/common/logger.js';
import { ImageService } from '../../src/images/service.js';

const [stateDir, registriesFile, reference] = process.argv.slice(2);
if (stateDir === undefined || registriesFile === undefined || reference === undefined) {
  process.stderr.write('usage: images-pull-child <stateDir> <registriesFile> <reference>\n');
  process.exit(2);
}
const service = new ImageService({ stateDir, registriesConfigPath: registriesFile, logger: silentLogger(), isImageInUse: () => false });
await service.init();
process.stdout.write('pulling\n');
await service.pullImage({ image: { image: reference } });
process.stdout.write('pulled\n');
service.close();
