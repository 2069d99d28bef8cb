/**
 * The JSON Schema of the config file. Every key is optional (built-in defaults fill the rest) and
 * every unknown key is an error, so a typo never silently falls back to a default.
 */
const positiveInt = { type: 'integer', minimum: 1 } as const;
const nonNegativeInt = { type: 'integer', minimum: 0 } as const;
const absolutePath = { type: 'string', pattern: '^/' } as const;
const nonEmptyString = { type: 'string', minLength: 1 } as const;

const cpuMemory = {
  type: 'object',
  additionalProperties: false,
  properties: { cpuMillicores: nonNegativeInt, memoryMiB: nonNegativeInt },
} as const;

const handlerProfile = {
  type: 'object',
  additionalProperties: false,
  properties: {
    confidential: { type: 'boolean' },
    description: { type: 'string' },
    vm: {
      type: 'object',
      additionalProperties: false,
      properties: {
        defaultVcpus: positiveInt,
        defaultMemoryMiB: positiveInt,
        minMemoryMiB: positiveInt,
        maxVcpus: { type: 'integer', minimum: 1, maximum: 288 },
        maxMemoryMiB: positiveInt,
        hotplugVcpus: nonNegativeInt,
        hotplugMemoryMiB: nonNegativeInt,
        freePageReporting: { type: 'boolean' },
      },
    },
    guestOverhead: cpuMemory,
    vmmOverhead: cpuMemory,
    pcie: {
      type: 'object',
      additionalProperties: false,
      properties: {
        vfioPolicy: { enum: ['cold-plug', 'hot-plug'] },
        portType: { enum: ['root-port', 'switch-port'] },
        sparePorts: nonNegativeInt,
        pref64ReserveFloorMiB: nonNegativeInt,
        memReserveFloorMiB: nonNegativeInt,
      },
    },
    vmmConfinement: {
      type: 'object',
      additionalProperties: false,
      properties: {
        seccomp: { type: 'boolean' },
        unprivileged: { type: 'boolean' },
        optOutReason: { type: ['string', 'null'], minLength: 1, maxLength: 500 },
      },
    },
    tee: {
      type: 'object',
      additionalProperties: false,
      properties: { kind: { enum: ['auto', 'none', 'vtpm', 'snp', 'tdx'] } },
    },
  },
} as const;

export const configFileSchema = {
  $id: 'https://kata-ts.dev/schemas/config.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    socketPath: absolutePath,
    stateDir: absolutePath,
    mountNamespacePath: { type: ['string', 'null'], pattern: '^/[^/].*/[^/]+$' },
    logLevel: { enum: ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] },
    metricsAddress: { type: ['string', 'null'], pattern: '^[^:\\s]+:[0-9]{1,5}$' },
    cgroupDriver: { enum: ['auto', 'systemd', 'cgroupfs'] },
    cgroupRoot: absolutePath,
    dbusAddress: { type: ['string', 'null'], minLength: 1 },
    systemdRuntimeDir: absolutePath,
    hypervisor: {
      type: 'object',
      additionalProperties: false,
      properties: {
        qemuBinary: nonEmptyString,
        acceleration: { enum: ['auto', 'kvm', 'tcg'] },
        kernelPath: absolutePath,
        initrdPath: absolutePath,
        guestImagePath: { type: ['string', 'null'], pattern: '^/' },
        virtiofsdBinary: absolutePath,
        kernelParams: { type: 'array', items: nonEmptyString },
        readyTimeoutMs: positiveInt,
        stopTimeoutMs: positiveInt,
        qmpTimeoutMs: positiveInt,
        agentKeepalive: {
          type: 'object',
          additionalProperties: false,
          properties: {
            // 0 turns the keepalive off; at most 10 minutes between pings.
            intervalMs: { type: 'integer', minimum: 0, maximum: 600_000 },
            misses: { type: 'integer', minimum: 1, maximum: 100 },
          },
        },
        tcgTranslationCacheMiB: { type: 'integer', minimum: 16, maximum: 4096 },
        vmmIdentities: {
          type: 'object',
          additionalProperties: false,
          properties: {
            // Never 0 (root); doctor warns when the range holds an account of /etc/passwd.
            firstId: { type: 'integer', minimum: 1, maximum: 4_294_967_294 },
            count: { type: 'integer', minimum: 1, maximum: 16_777_216 },
            leaseDir: absolutePath,
            // Up to a day: a longer rest only hoards the range.
            quarantineMs: { type: 'integer', minimum: 0, maximum: 86_400_000 },
          },
        },
        // QEMU alone needs more than 16 tasks before its first vCPU; virtiofsd shares the cgroup.
        vmmPidsMargin: { type: 'integer', minimum: 16, maximum: 1_000_000 },
        firmware: {
          type: 'object',
          additionalProperties: false,
          properties: {
            ovmfCodePath: absolutePath,
            ovmfVarsPath: absolutePath,
            snpFirmwarePath: absolutePath,
            tdxFirmwarePath: absolutePath,
          },
        },
        tpm: {
          type: 'object',
          additionalProperties: false,
          properties: { swtpmBinary: absolutePath, swtpmSetupBinary: absolutePath, caDir: absolutePath },
        },
      },
    },
    pcie: {
      type: 'object',
      additionalProperties: false,
      properties: {
        sysfsRoot: absolutePath,
        devRoot: absolutePath,
        cdiSpecDirs: { type: 'array', items: absolutePath },
        podResourcesSocket: { type: ['string', 'null'], pattern: '^/' },
        devNumbersFile: { type: ['string', 'null'], pattern: '^/' },
        simulateVfioWith: { type: ['string', 'null'], pattern: '^[a-z0-9][a-z0-9-]*$' },
      },
    },
    images: {
      type: 'object',
      additionalProperties: false,
      properties: {
        registriesConfigPath: { type: ['string', 'null'], pattern: '^/' },
      },
    },
    network: {
      type: 'object',
      additionalProperties: false,
      properties: {
        mode: { enum: ['cni', 'none'] },
        cniConfDir: absolutePath,
        cniBinDirs: { type: 'array', items: absolutePath, minItems: 1 },
        cniTimeoutMs: positiveInt,
      },
    },
    streaming: {
      type: 'object',
      additionalProperties: false,
      properties: {
        address: { type: 'string', pattern: '^(\\[[0-9a-fA-F:.]+\\]|[^:\\s\\[\\]]+):[0-9]{1,5}$' },
        tlsCertPath: { type: ['string', 'null'], pattern: '^/' },
        tlsKeyPath: { type: ['string', 'null'], pattern: '^/' },
        tokenTtlMs: positiveInt,
        maxTokensInFlight: positiveInt,
        streamCreationTimeoutMs: positiveInt,
        // A socket timer: node clamps anything past 2^31 - 1 ms to 1 ms, so that is the most.
        streamIdleTimeoutMs: { type: 'integer', minimum: 1, maximum: 2_147_483_647 },
      },
    },
    shim: {
      type: 'object',
      additionalProperties: false,
      properties: {
        stateRoot: absolutePath,
        mode: { enum: ['node', 'pod'] },
      },
    },
    defaultHandler: nonEmptyString,
    handlers: {
      type: 'object',
      propertyNames: { pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$', maxLength: 63 },
      additionalProperties: handlerProfile,
    },
    pool: {
      type: 'object',
      additionalProperties: false,
      properties: {
        sizes: {
          type: 'object',
          propertyNames: { pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$', maxLength: 63 },
          additionalProperties: { type: 'integer', minimum: 0, maximum: 64 },
        },
        // The style and the path's components are checked in validate.ts (naming the field).
        cgroupParent: { type: ['string', 'null'], minLength: 1, maxLength: 1024 },
        // The kernel's cpu.shares bounds (MIN_SHARES, MAX_SHARES).
        cpuShares: { type: 'integer', minimum: 2, maximum: 262_144 },
        claimTimeoutMs: { type: 'integer', minimum: 1000, maximum: 600_000 },
      },
    },
    templates: {
      type: 'object',
      additionalProperties: false,
      properties: {
        handlers: {
          type: 'array',
          uniqueItems: true,
          items: { type: 'string', pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$', maxLength: 63 },
        },
        // Absolute, no comma (it goes into QEMU's -object argument), checked in validate.ts.
        root: { type: 'string', minLength: 2, maxLength: 1024 },
      },
    },
  },
} as const;
