import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.regex.Pattern;

/**
 * Matches each input line against Spark's StreamExecution.PROXY_ERROR (Spark 4.x), as Spark's
 * stream thread does when a stopped query's foreachBatch function failed, on a thread of the
 * JVM's default stack size on 64-bit Linux (1 MB): prints "match", "no match" or "overflow" per
 * line, for tests/test_batch_errors.py. Lines are hex (four digits per UTF-16 unit), so that a
 * traceback with its line breaks fits on one line.
 */
public class ProxyError {
    static final Pattern PROXY_ERROR = Pattern.compile(
        "py4j.protocol.Py4JJavaError: An error occurred while calling"
        + "((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|java.io.InterruptedIOException"
        + "|java.nio.channels.ClosedByInterruptException)");

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            StringBuilder decoded = new StringBuilder();
            for (int i = 0; i + 4 <= line.length(); i += 4) {
                decoded.append((char) Integer.parseInt(line.substring(i, i + 4), 16));
            }
            String text = decoded.toString();
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
