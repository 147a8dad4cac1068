import java.nio.charset.StandardCharsets;
import java.util.regex.Pattern;

/**
 * Matches each input text against Spark's StreamExecution.PROXY_ERROR (Spark 4.x), as Spark's
 * stream thread does when a stopped query's foreachBatch function failed, on a thread of the
 * JVM's default stack size on 64-bit Linux (1 MB): prints "match", "no match" or "overflow" per
 * text, for tests/test_batch_errors.py. The texts come on standard input, UTF-8, separated by
 * NULs.
 */
public class ProxyError {
    static final Pattern PROXY_ERROR = Pattern.compile(
        "py4j.protocol.Py4JJavaError: An error occurred while calling"
        + "((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|java.io.InterruptedIOException"
        + "|java.nio.channels.ClosedByInterruptException)");

    public static void main(String[] args) throws Exception {
        String input = new String(System.in.readAllBytes(), StandardCharsets.UTF_8);
        for (String text : input.split("\u0000")) {
            String[] result = {"overflow"};
            Thread matcher = new Thread(null, () -> {
                try {
                    result[0] = PROXY_ERROR.matcher(text).find() ? "match" : "no match";
                } catch (StackOverflowError e) {
                    result[0] = "overflow";
                }
            }, "matcher", 1024 * 1024);
            matcher.start();
            matcher.join();
            System.out.println(result[0]);
        }
    }
}
